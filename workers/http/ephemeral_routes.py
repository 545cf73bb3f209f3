"""Typing and presence (`/_matrix/client/v3`): the in-memory streams' client endpoints.

* `PUT /rooms/{roomId}/typing/{userId}` `{"typing": bool, "timeout": ms}` -> `{}`: your own user
  id only, in a room you are joined to; forwarded to the typing writer.
* `PUT /presence/{userId}/status` `{"presence": "online|unavailable|offline", "status_msg"?}` -> `{}`
  (your own), `GET /presence/{userId}/status` -> `{"presence", "last_active_ago"?, "status_msg"?,
  "currently_active"?}` (yourself, or a user you share a room with).
With no typing (or presence) writer configured the feature is off: a PUT is accepted and does
nothing, a GET says offline. The services come from `workers.assembly.ephemeral` once the worker built them.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.ephemeral.presence_service import PresenceService
from workers.handlers.ephemeral.presence_sync import PresenceSyncTracker
from workers.handlers.ephemeral.typing_service import TypingService
from workers.http.auth import requester
from workers.http.bodies import json_body
from workers.http.errors import ApiError
from workers.storage import events as store
from workers.streams.presence import PRESENCE_STATES

CLIENT = "/_matrix/client/v3"
MAX_TYPING_TIMEOUT_MS = 120_000


@dataclass
class EphemeralServices:
    """Filled in by the worker once `workers.assembly.ephemeral` has built them."""

    typing: TypingService | None = None
    presence: PresenceService | None = None
    #: Counts /sync requests per (user, device) for presence (USER_SYNC).
    sync_tracker: PresenceSyncTracker | None = None


class EphemeralRoutes:
    def __init__(self, pool: asyncpg.Pool, services: EphemeralServices) -> None:
        self._pool = pool
        self.services = services

    def routes(self) -> list[web.RouteDef]:
        return [
            web.put(f"{CLIENT}/rooms/{{room_id}}/typing/{{user_id}}", self.typing),
            web.put(f"{CLIENT}/presence/{{user_id}}/status", self.set_presence),
            web.get(f"{CLIENT}/presence/{{user_id}}/status", self.get_presence),
        ]

    async def _own(self, request: web.Request) -> str:
        who = await requester(self._pool, request)
        if request.match_info["user_id"] != who.user_id:
            raise ApiError(403, "M_FORBIDDEN", "you can only set your own typing and presence")
        return who.user_id

    async def typing(self, request: web.Request) -> web.Response:
        user_id = await self._own(request)
        try:
            room_id = identifiers.check_room_id(request.match_info["room_id"])
        except ValueError as e:
            raise ApiError(400, "M_INVALID_PARAM", str(e)) from None
        body = await json_body(request)
        typing, timeout = body.get("typing"), body.get("timeout", 30_000)
        if not isinstance(typing, bool):
            raise ApiError(400, "M_BAD_JSON", "typing must be true or false")
        if typing and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0):
            raise ApiError(400, "M_BAD_JSON", "timeout is a whole number of milliseconds")
        async with self._pool.acquire() as conn:
            if await store.membership(conn, user_id, room_id) != "join":
                raise ApiError(403, "M_FORBIDDEN", f"{user_id} is not in {room_id}")
        service = self.services.typing
        if service is not None and service.writer is not None:
            await service.set_typing(room_id, user_id, typing, min(int(timeout or 0), MAX_TYPING_TIMEOUT_MS))
        return web.json_response({})

    async def set_presence(self, request: web.Request) -> web.Response:
        user_id = await self._own(request)
        body = await json_body(request)
        presence, status_msg = body.get("presence"), body.get("status_msg")
        if presence not in PRESENCE_STATES:
            raise ApiError(400, "M_BAD_JSON", f"presence must be one of {list(PRESENCE_STATES)}")
        if status_msg is not None and (not isinstance(status_msg, str) or len(status_msg) > 1000):
            raise ApiError(400, "M_BAD_JSON", "status_msg is a string of at most 1,000 characters")
        service = self.services.presence
        if service is not None and service.writer is not None:
            await service.set_presence(user_id, str(presence), status_msg)
        return web.json_response({})

    async def get_presence(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        target = request.match_info["user_id"]
        if target != who.user_id:
            async with self._pool.acquire() as conn:
                shared = set(await store.joined_rooms(conn, who.user_id)) & set(
                    await store.joined_rooms(conn, target)
                )
            if not shared:
                raise ApiError(403, "M_FORBIDDEN", f"you share no room with {target}")
        service = self.services.presence
        if service is None or service.writer is None:
            return web.json_response({"presence": "offline"})
        return web.json_response(await service.get_presence(target))
