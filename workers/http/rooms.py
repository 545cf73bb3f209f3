"""Rooms: create, join and leave, send, state, history (`/_matrix/client/v3/...`).

Every write goes through `RoomWrites`, which checks it on the room's persister, here or behind a
worker request; the client never learns which worker owns a room. Reads (`state`, `messages`,
`joined_rooms`) answer from this worker's replicated view, or are relayed to a worker that has one
(`workers.http.read_forwarding`) when this one serves no reads.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.rooms import restricted, room_plan
from workers.handlers.rooms import rules as rooms
from workers.handlers.rooms.versions import REDACTION_EVENT, render
from workers.handlers.rooms.writes import RoomWrites
from workers.handlers.sync.handler import SyncHandler
from workers.handlers.sync.messages import Messages, NotAMember
from workers.http.auth import requester
from workers.http.bodies import event_id_response, json_body
from workers.http.errors import ApiError, checked, unavailable
from workers.http.read_forwarding import ReadRouting
from workers.model import DEFAULT_ROOM_VERSION, MEMBER_EVENT, MEMBERSHIPS, PRESENT, NewEvent
from workers.storage import directory, forgotten_rooms
from workers.storage import events as store

#: What `/unban` acts on (`/kick` acts on `PRESENT`: a member, an invitee or a knocker).
BANNED = frozenset({"ban"})
CLIENT = "/_matrix/client/v3"
ROOM = CLIENT + "/rooms/{room_id}"


class RoomRoutes:
    def __init__(
        self,
        pool: asyncpg.Pool,
        writes: RoomWrites,
        sync: SyncHandler | None,
        messages: Messages | None,
        default_room_version: str = DEFAULT_ROOM_VERSION,
        reads: ReadRouting | None = None,
    ) -> None:
        self._pool = pool
        self.writes = writes
        self._sync = sync
        self._messages = messages
        self._default_room_version = default_room_version
        self._read_routing = reads

    def _read(self, route: web.RouteDef) -> web.RouteDef:
        return route if self._read_routing is None else self._read_routing.route(route)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(f"{CLIENT}/createRoom", self.create_room),
            web.post(f"{CLIENT}/join/{{room}}", self.join),
            web.post(f"{ROOM}/join", self.join),
            web.post(f"{ROOM}/leave", self.leave),
            web.post(f"{CLIENT}/knock/{{room}}", self.knock),
            web.post(f"{ROOM}/forget", self.forget),
            web.post(f"{ROOM}/invite", self.member_op("invite")),
            web.post(f"{ROOM}/kick", self.member_op("leave", PRESENT)),
            web.post(f"{ROOM}/ban", self.member_op("ban")),
            web.post(f"{ROOM}/unban", self.member_op("leave", BANNED)),
            web.put(f"{ROOM}/send/{{event_type}}/{{txn_id}}", self.send),
            web.put(f"{ROOM}/redact/{{event_id}}/{{txn_id}}", self.redact),
            web.put(f"{ROOM}/state/{{event_type}}", self.put_state),
            web.put(f"{ROOM}/state/{{event_type}}/{{state_key:.*}}", self.put_state),
            self._read(web.get(f"{ROOM}/state", self.get_state)),
            self._read(web.get(f"{ROOM}/state/{{event_type}}", self.get_state_event)),
            self._read(web.get(f"{ROOM}/state/{{event_type}}/{{state_key:.*}}", self.get_state_event)),
            self._read(web.get(f"{ROOM}/messages", self.messages)),
            self._read(web.get(f"{ROOM}/event/{{event_id}}", self.event)),
            self._read(web.get(f"{ROOM}/joined_members", self.joined_members)),
            web.get(f"{CLIENT}/joined_rooms", self.joined_rooms),
            web.get(f"{CLIENT}/directory/room/{{alias}}", self.resolve_alias),
        ]

    def _reads(self) -> SyncHandler:
        if self._sync is None:
            raise unavailable("this worker serves no reads (serve_reads: false) and relays none", 10)
        return self._sync

    @staticmethod
    def _room_id(request: web.Request) -> str:
        return checked(identifiers.check_room_id, request.match_info["room_id"])

    @staticmethod
    def _event_type(request: web.Request) -> str:
        return checked(identifiers.check_event_type, request.match_info["event_type"])

    async def create_room(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        body = await json_body(request)
        room_id = self.writes.new_room_id()
        plan = room_plan.plan_room(
            body, who.user_id, room_id, self.writes.server_name, self._default_room_version
        )
        if plan.alias is not None:
            async with self._pool.acquire() as conn:
                if not await directory.add_alias(conn, plan.alias, room_id, who.user_id):
                    raise ApiError(400, "M_ROOM_IN_USE", f"{plan.alias} is taken")
        try:
            await self.writes.create(plan.events)
        except BaseException:
            if plan.alias is not None:
                async with self._pool.acquire() as conn:
                    await directory.remove_alias(conn, plan.alias)
            raise
        return web.json_response({"room_id": room_id})

    async def _membership(
        self,
        room_id: str,
        sender: str,
        target: str,
        membership: str,
        body: dict[str, Any],
        target_was: frozenset[str] | None = None,
    ) -> None:
        content: dict[str, Any] = {"membership": membership}
        reason = body.get("reason")
        if isinstance(reason, str):
            content["reason"] = reason
        if membership == "join" and sender == target:
            await self._vouched(room_id, sender, content)
        event = NewEvent(rooms.new_event_id(), room_id, MEMBER_EVENT, sender, content, target)
        await self.writes.send(event, target_was=target_was)

    async def _vouched(self, room_id: str, user_id: str, content: dict[str, Any]) -> None:
        """Name the member who vouches for `user_id`'s join when the room is restricted and the
        user is neither invited nor joined (`workers.handlers.rooms.restricted`)."""
        async with self._pool.acquire() as conn:
            authoriser = await restricted.authoriser(conn, room_id, user_id)
        if authoriser is not None:
            content[rooms.AUTHORISING_USER] = authoriser

    async def join(self, request: web.Request) -> web.Response:
        return await self._self_membership(request, "join")

    async def knock(self, request: web.Request) -> web.Response:
        """`POST /knock/{roomIdOrAlias}` `{"reason"?}`: ask to be let into a room whose join rule
        is `knock`; a member with the invite level answers with an invite (or a kick)."""
        return await self._self_membership(request, "knock")

    async def _self_membership(self, request: web.Request, membership: str) -> web.Response:
        who = await requester(self._pool, request)
        body = await json_body(request)
        target = request.match_info.get("room_id") or request.match_info["room"]
        if target.startswith("#"):
            async with self._pool.acquire() as conn:
                room_id = await directory.room_for_alias(conn, target)
            if room_id is None:
                raise ApiError(404, "M_NOT_FOUND", f"no room has the alias {target}")
        else:
            room_id = checked(identifiers.check_room_id, target)
        await self._membership(room_id, who.user_id, who.user_id, membership, body)
        return web.json_response({"room_id": room_id})

    async def leave(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        body = await json_body(request)
        await self._membership(self._room_id(request), who.user_id, who.user_id, "leave", body)
        return web.json_response({})

    async def forget(self, request: web.Request) -> web.Response:
        """`POST /rooms/{roomId}/forget`: the room leaves the user's `rooms.leave` for good (until
        a new membership); only once they left or were banned (400 M_UNKNOWN, as Synapse)."""
        who = await requester(self._pool, request)
        room_id = self._room_id(request)
        await json_body(request)
        async with self._pool.acquire() as conn:
            refused = await forgotten_rooms.forget_room(conn, who.user_id, room_id)
        if refused is not None:
            raise ApiError(400, "M_UNKNOWN", f"{who.user_id} is in {room_id} ({refused}): leave it first")
        return web.json_response({})

    def member_op(self, membership: str, target_was: frozenset[str] | None = None) -> Any:
        """`/invite`, `/kick`, `/ban`, `/unban`: `membership` of the body's `user_id`; a kick and an
        unban act only on a target in `target_was`, as the room's writer sees it (403 otherwise, as
        Synapse answers: a kick of a banned user is not an unban)."""

        async def handler(request: web.Request) -> web.Response:
            who = await requester(self._pool, request)
            room_id = self._room_id(request)
            body = await json_body(request)
            target = body.get("user_id")
            if not isinstance(target, str):
                raise ApiError(400, "M_MISSING_PARAM", "user_id is required")
            checked(identifiers.check_user_id, target)
            await self._membership(room_id, who.user_id, target, membership, body, target_was)
            return web.json_response({})

        return handler

    async def send(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        room_id, event_type = self._room_id(request), self._event_type(request)
        txn_id = request.match_info["txn_id"]
        content = await json_body(request)
        event_id = rooms.txn_event_id(room_id, who.user_id, who.device_id, txn_id)
        written = await self.writes.send(
            NewEvent(event_id, room_id, event_type, who.user_id, content), txn=True
        )
        return event_id_response(written.event_id)

    async def redact(self, request: web.Request) -> web.Response:
        """`PUT /rooms/{roomId}/redact/{eventId}/{txnId}` `{"reason"?}`: an m.room.redaction of the
        event (stored with `redacts` in its content; rendered for the room's version)."""
        who = await requester(self._pool, request)
        room_id = self._room_id(request)
        target = request.match_info["event_id"]
        if not target.startswith("$") or len(target) > identifiers.MAX_ID_LENGTH:
            raise ApiError(400, "M_INVALID_PARAM", "eventId must be an event id ($...)")
        body = await json_body(request)
        reason = body.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ApiError(400, "M_BAD_JSON", "reason must be a string")
        content: dict[str, Any] = {"redacts": target, **({"reason": reason} if reason is not None else {})}
        event_id = rooms.txn_event_id(
            room_id, who.user_id, who.device_id, "redact\0" + request.match_info["txn_id"]
        )
        written = await self.writes.send(
            NewEvent(event_id, room_id, REDACTION_EVENT, who.user_id, content), txn=True
        )
        return event_id_response(written.event_id)

    async def put_state(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        room_id, event_type = self._room_id(request), self._event_type(request)
        state_key = checked(identifiers.check_state_key, request.match_info.get("state_key", ""))
        content = await json_body(request)
        membership = content.get("membership")
        if event_type == MEMBER_EVENT and not (isinstance(membership, str) and membership in MEMBERSHIPS):
            raise ApiError(400, "M_BAD_JSON", "content.membership must be join, leave, invite, ban or knock")
        if event_type == MEMBER_EVENT:
            # Only the authorising server adds it, and signs the event; a client copying it from an
            # earlier member event (a display name change) gets it dropped, as Synapse drops it.
            content.pop(rooms.AUTHORISING_USER, None)
            if membership == "join" and state_key == who.user_id:
                await self._vouched(room_id, who.user_id, content)
        event = NewEvent(rooms.new_event_id(), room_id, event_type, who.user_id, content, state_key)
        written = await self.writes.send(event)
        return event_id_response(written.event_id)

    async def _state(self, request: web.Request) -> list[Any]:
        who = await requester(self._pool, request)
        room_id = self._room_id(request)
        state = await self._reads().room_state(who.user_id, room_id)
        if state is None:
            raise ApiError(403, "M_FORBIDDEN", f"{who.user_id} is not in {room_id}")
        return state

    async def get_state(self, request: web.Request) -> web.Response:
        state = await self._state(request)
        version = await self._reads().room_versions.get(self._room_id(request))
        return web.json_response([render(e, version) for e in state])

    async def get_state_event(self, request: web.Request) -> web.Response:
        event_type = self._event_type(request)
        state_key = request.match_info.get("state_key", "")
        for event in await self._state(request):
            if event.type == event_type and event.state_key == state_key:
                return web.json_response(event.content)
        raise ApiError(404, "M_NOT_FOUND", f"no {event_type} state with key {state_key!r}")

    async def messages(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        room_id = self._room_id(request)
        self._reads()
        assert self._messages is not None
        direction = request.query.get("dir", "b")
        if direction not in ("b", "f"):
            raise ApiError(400, "M_INVALID_PARAM", "dir must be b or f")
        try:
            limit = int(request.query.get("limit", "10"))
        except ValueError:
            raise ApiError(400, "M_INVALID_PARAM", "limit is a whole number") from None
        try:
            body = await self._messages.page(
                who.user_id,
                room_id,
                request.query.get("from"),
                request.query.get("to"),
                direction == "b",
                limit,
            )
        except NotAMember as e:
            raise ApiError(403, "M_FORBIDDEN", str(e)) from None
        except ValueError as e:  # a malformed token (InvalidTokenError is one)
            raise ApiError(400, "M_INVALID_PARAM", str(e)) from None
        return web.json_response(body)

    async def event(self, request: web.Request) -> web.Response:
        """One event, when the requester may see it (/messages' rules); 404 otherwise, so an id
        tells nothing about a room one cannot read."""
        who = await requester(self._pool, request)
        room_id = self._room_id(request)
        self._reads()
        assert self._messages is not None
        found = await self._messages.event(who.user_id, room_id, request.match_info["event_id"])
        if found is None:
            raise ApiError(404, "M_NOT_FOUND", "no such event, or not one you may see")
        version = await self._reads().room_versions.get(room_id)
        return web.json_response(render(found, version))

    async def joined_members(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        room_id = self._room_id(request)
        sync = self._reads()
        if await sync.room_state(who.user_id, room_id) is None:
            raise ApiError(403, "M_FORBIDDEN", f"{who.user_id} is not in {room_id}")
        async with self._pool.acquire() as conn:
            members = await store.joined_members(conn, room_id)
        return web.json_response({"joined": {m: {} for m in sorted(members)}})

    async def joined_rooms(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        async with self._pool.acquire() as conn:
            return web.json_response({"joined_rooms": await store.joined_rooms(conn, who.user_id)})

    async def resolve_alias(self, request: web.Request) -> web.Response:
        alias = request.match_info["alias"]
        async with self._pool.acquire() as conn:
            room_id = await directory.room_for_alias(conn, alias)
        if room_id is None:
            raise ApiError(404, "M_NOT_FOUND", f"no room has the alias {alias}")
        return web.json_response({"room_id": room_id, "servers": [self.writes.server_name]})
