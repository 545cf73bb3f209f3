"""The client HTTP API of a worker (aiohttp).

| route | who serves it |
|---|---|
| POST /register {"user_id"} | any worker |
| POST /createRoom {"join_rule"} | a writer of `events` |
| POST /rooms/{room}/send/{type} | the writer that owns the room (others answer 421 + `writer`) |
| POST /rooms/{room}/state/{type}[/{state_key}] | same |
| POST /rooms/{room}/backfill {"events": [...]} | same (negative stream, never in /sync) |
| GET /rooms/{room}/state | any worker; members only |
| GET /sync?since=&timeout= | any worker |
| GET /health, GET /metrics | any worker, no auth |

Client routes need `Authorization: Bearer <token>`. Bodies are JSON objects (400 otherwise).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiohttp import web
from prometheus_client import CollectorRegistry

from idgen import InvalidTokenError
from workers.handlers import rooms
from workers.handlers.persist import EventPersister, PersisterOverloaded, PersisterStopped
from workers.handlers.sync import SyncHandler
from workers.http.bodies import json_body
from workers.http.errors import ApiError
from workers.http.health import health_routes
from workers.model import MEMBER_EVENT, NewEvent
from workers.routing import writer_for_room
from workers.storage import users

log = logging.getLogger(__name__)

_USER_ID = re.compile(r"^@[a-z0-9._=\-/]{1,64}$")
_ROOM_ID = re.compile(r"^![A-Za-z0-9._\-]{1,64}$")
_TYPE = re.compile(r"^[A-Za-z0-9._\-]{1,100}$")
MAX_SYNC_TIMEOUT_MS = 60_000
MAX_BACKFILL = 500


@dataclass
class ApiDeps:
    """What the routes use; `persister`/`backfill` are None on workers that do not write events,
    `sync` on workers that serve no reads (`serve_reads: false`)."""

    instance_name: str
    pool: asyncpg.Pool
    event_writers: list[str]
    persister: EventPersister | None
    backfill: EventPersister | None
    sync: SyncHandler | None
    room_views: rooms.RoomViews
    metrics: CollectorRegistry
    health: Callable[[], tuple[bool, dict[str, Any]]]
    accepting: Callable[[], bool]


class ClientApi:
    def __init__(self, deps: ApiDeps) -> None:
        self.deps = deps
        self._token_users: dict[str, str] = {}

    def application(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=1 << 20)
        app.add_routes(
            [
                web.post("/register", self.register),
                web.post("/createRoom", self.create_room),
                web.post("/rooms/{room_id}/send/{event_type}", self.send),
                web.post("/rooms/{room_id}/state/{event_type}", self.send_state),
                web.post("/rooms/{room_id}/state/{event_type}/{state_key}", self.send_state),
                web.post("/rooms/{room_id}/backfill", self.backfill),
                web.get("/rooms/{room_id}/state", self.room_state),
                web.get("/sync", self.sync),
                *health_routes(self.deps.health, self.deps.metrics),
            ]
        )
        return app

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if not self.deps.accepting() and not request.path.startswith(("/health", "/metrics")):
            return ApiError(503, "SHUTTING_DOWN", "this worker is shutting down").response()
        try:
            return await handler(request)
        except ApiError as e:
            return e.response()
        except web.HTTPException:
            raise
        except PersisterOverloaded as e:
            return ApiError(503, "OVERLOADED", str(e)).response()
        except PersisterStopped as e:
            return ApiError(503, "SHUTTING_DOWN", str(e)).response()
        except Exception:
            log.exception("request failed path=%s", request.path)
            return ApiError(500, "INTERNAL", "internal error (logged)").response()

    async def _user(self, request: web.Request) -> str:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme != "Bearer" or not token:
            raise ApiError(401, "MISSING_TOKEN", "send Authorization: Bearer <access token>")
        user = self._token_users.get(token)
        if user is None:
            async with self.deps.pool.acquire() as conn:
                user = await users.user_for_token(conn, token)
            if user is None:
                raise ApiError(401, "UNKNOWN_TOKEN", "unknown access token")
            if len(self._token_users) > 100_000:
                self._token_users.clear()
            self._token_users[token] = user
        return user

    async def register(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        user_id = body.get("user_id")
        if not isinstance(user_id, str) or not _USER_ID.match(user_id):
            raise ApiError(400, "BAD_USER_ID", "user_id must look like @name (lowercase, digits, ._=-/)")
        async with self.deps.pool.acquire() as conn:
            try:
                token = await users.register(conn, user_id)
            except users.UserExistsError:
                raise ApiError(409, "USER_IN_USE", f"{user_id} is already registered") from None
        return web.json_response({"user_id": user_id, "access_token": token})

    def _sync_handler(self) -> SyncHandler:
        if self.deps.sync is None:
            raise ApiError(
                421, "NOT_A_READER", f"{self.deps.instance_name} serves no reads (serve_reads is false)"
            )
        return self.deps.sync

    def _persister_for(self, room_id: str | None, backfill: bool = False) -> EventPersister:
        persister = self.deps.backfill if backfill else self.deps.persister
        if persister is None:
            raise ApiError(
                421, "NOT_A_WRITER", f"{self.deps.instance_name} does not write events",
                writers=self.deps.event_writers,
            )  # fmt: skip
        if room_id is not None:
            owner = writer_for_room(room_id, self.deps.event_writers)
            if owner != self.deps.instance_name:
                raise ApiError(421, "WRONG_WRITER", f"room {room_id} is written by {owner}", writer=owner)
        return persister

    async def create_room(self, request: web.Request) -> web.Response:
        user = await self._user(request)
        body = await json_body(request)
        persister = self._persister_for(None)
        join_rule = body.get("join_rule", "invite")
        if join_rule not in rooms.JOIN_RULES:
            raise ApiError(400, "BAD_JOIN_RULE", f"join_rule must be one of {sorted(rooms.JOIN_RULES)}")
        room_id = rooms.new_room_id()
        while writer_for_room(room_id, self.deps.event_writers) != self.deps.instance_name:
            room_id = rooms.new_room_id()
        events = await persister.persist_many(rooms.create_room_events(user, join_rule, room_id))
        return web.json_response({"room_id": room_id, "stream_ordering": events[-1].stream_ordering})

    def _room_id(self, request: web.Request) -> str:
        room_id = request.match_info["room_id"]
        if not _ROOM_ID.match(room_id):
            raise ApiError(400, "BAD_ROOM_ID", "room ids look like !abc")
        return room_id

    async def _send_checked(self, event: NewEvent) -> web.Response:
        persister = self._persister_for(event.room_id)
        target = event.state_key if event.type == MEMBER_EVENT else None
        view = await self.deps.room_views.view(event.room_id, event.sender, target)
        try:
            rooms.check(event, view)
        except rooms.NotFound as e:
            raise ApiError(404, "NOT_FOUND", str(e)) from None
        except rooms.Forbidden as e:
            raise ApiError(403, "FORBIDDEN", str(e)) from None
        except rooms.BadEvent as e:
            raise ApiError(400, "BAD_EVENT", str(e)) from None
        persisted = await persister.persist(event)
        return web.json_response(
            {"event_id": persisted.event_id, "stream_ordering": persisted.stream_ordering}
        )

    def _event_type(self, request: web.Request) -> str:
        event_type = request.match_info["event_type"]
        if not _TYPE.match(event_type):
            raise ApiError(400, "BAD_TYPE", "event types use letters, digits, '.', '_' and '-'")
        return event_type

    async def send(self, request: web.Request) -> web.Response:
        user = await self._user(request)
        room_id, event_type = self._room_id(request), self._event_type(request)
        content = await json_body(request)
        return await self._send_checked(NewEvent(rooms.new_event_id(), room_id, event_type, user, content))

    async def send_state(self, request: web.Request) -> web.Response:
        user = await self._user(request)
        room_id, event_type = self._room_id(request), self._event_type(request)
        state_key = request.match_info.get("state_key", "")
        if len(state_key) > 255:
            raise ApiError(400, "BAD_STATE_KEY", "state_key over 255 characters")
        content = await json_body(request)
        event = NewEvent(rooms.new_event_id(), room_id, event_type, user, content, state_key)
        return await self._send_checked(event)

    async def backfill(self, request: web.Request) -> web.Response:
        user = await self._user(request)
        room_id = self._room_id(request)
        body = await json_body(request, max_bytes=1 << 20)
        persister = self._persister_for(room_id, backfill=True)
        items = body.get("events")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_BACKFILL:
            raise ApiError(400, "BAD_EVENTS", f"events must be a list of 1 to {MAX_BACKFILL} objects")
        view = await self.deps.room_views.view(room_id, user, None)
        if view.sender_membership != "join":
            raise ApiError(403, "FORBIDDEN", f"{user} is not in {room_id}")
        events: list[NewEvent] = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("content", {}), dict):
                raise ApiError(400, "BAD_EVENTS", "each event is {type, content} (state_key optional)")
            event_type = item.get("type")
            if not isinstance(event_type, str) or not _TYPE.match(event_type):
                raise ApiError(400, "BAD_TYPE", "each event needs a valid type")
            events.append(NewEvent(rooms.new_event_id(), room_id, event_type, user, item.get("content", {})))
        persisted = await persister.persist_many(events)
        return web.json_response({"stream_orderings": [e.stream_ordering for e in persisted]})

    async def room_state(self, request: web.Request) -> web.Response:
        user = await self._user(request)
        room_id = self._room_id(request)
        state = await self._sync_handler().room_state(user, room_id)
        if state is None:
            raise ApiError(403, "FORBIDDEN", f"{user} is not in {room_id}")
        return web.json_response(
            {"state": [{"type": t, "state_key": k, "event_id": e} for (t, k), e in state]}
        )

    async def sync(self, request: web.Request) -> web.Response:
        user = await self._user(request)
        handler = self._sync_handler()
        try:
            timeout_ms = int(request.query.get("timeout", "0"))
        except ValueError:
            raise ApiError(400, "BAD_TIMEOUT", "timeout is a whole number of milliseconds") from None
        timeout_ms = max(0, min(timeout_ms, MAX_SYNC_TIMEOUT_MS))
        try:
            result = await handler.sync(user, request.query.get("since"), timeout_ms / 1000)
        except InvalidTokenError as e:
            raise ApiError(400, "BAD_TOKEN", str(e)) from None
        return web.json_response(result)
