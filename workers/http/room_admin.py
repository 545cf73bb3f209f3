"""Synapse's Delete Room API, version 1 (synchronous), for server admins.

* `DELETE /_synapse/admin/v1/rooms/{roomId}` (and the older spelling
  `POST /_synapse/admin/v1/rooms/{roomId}/delete`) with `{block?, purge?, message?, room_name?}`
  answers `{kicked_users, failed_to_kick_users, local_aliases, new_room_id}` once the room is gone.

The worker that takes the request hands it to the room's writer (`RoomWrites.purge`), which removes
the local members and then the room (`workers.handlers.room_purge`). `new_room_user_id` (Synapse
moves the members to a new room) is refused: this server does not create a replacement room, so
`new_room_id` is always null and `message` and `room_name`, which only name that room, are ignored.
The caller's access token must belong to a server admin (403 M_FORBIDDEN otherwise).
"""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.room_purge import PurgeOptions
from workers.handlers.room_writes import RoomWrites
from workers.http.auth import require_admin
from workers.http.bodies import json_body
from workers.http.errors import ApiError, checked

ROOMS = "/_synapse/admin/v1/rooms"


class RoomAdmin:
    def __init__(self, pool: asyncpg.Pool, writes: RoomWrites) -> None:
        self._pool = pool
        self._writes = writes

    def routes(self) -> list[web.RouteDef]:
        return [
            web.delete(f"{ROOMS}/{{room_id}}", self.delete),
            web.post(f"{ROOMS}/{{room_id}}/delete", self.delete),
        ]

    async def delete(self, request: web.Request) -> web.Response:
        who = await require_admin(self._pool, request)
        room_id = checked(identifiers.check_room_id, request.match_info["room_id"])
        body = await json_body(request)
        options = PurgeOptions(_flag(body, "block", False), _flag(body, "purge", True), who.user_id)
        if body.get("new_room_user_id") is not None:
            raise ApiError(
                400, "M_INVALID_PARAM",
                "new_room_user_id is not supported: this server does not create a replacement room",
            )  # fmt: skip
        result = await self._writes.purge(room_id, options)
        return web.json_response(result.to_json())


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, "M_BAD_JSON", f"Param '{name}' must be a boolean, if given")
    return value
