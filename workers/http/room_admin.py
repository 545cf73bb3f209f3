"""Synapse's Delete Room API, both versions, for server admins.

* Version 2 (Synapse's current one, asynchronous): `DELETE /_synapse/admin/v2/rooms/{roomId}` with
  `{block?, purge?, message?, room_name?}` (a body is required, `{}` at least) answers
  `{"delete_id"}` at once; `GET /_synapse/admin/v2/rooms/{roomId}/delete_status` answers
  `{"results": [{delete_id, status, error?, shutdown_room}]}` and
  `GET /_synapse/admin/v2/rooms/delete_status/{deleteId}` one `{status, error?, shutdown_room}`.
* Version 1 (synchronous): `DELETE /_synapse/admin/v1/rooms/{roomId}` (and the older spelling
  `POST /_synapse/admin/v1/rooms/{roomId}/delete`), the same body, answers the result object
  `{kicked_users, failed_to_kick_users, local_aliases, new_room_id}` once the room is gone; unlike
  version 2 it also blocks a room id unknown here (`block: true`).

The worker that takes the request hands it to the room's writer (`RoomWrites.purge`), which removes
the local members and then the room (`workers.handlers.rooms.purge`). `new_room_user_id` (Synapse
moves the members to a new room) is refused: this server does not create a replacement room, so
`new_room_id` is always null and `message` and `room_name`, which only name that room, are ignored.
The caller's access token must belong to a server admin (403 M_FORBIDDEN otherwise).
"""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.rooms.purge import PurgeOptions
from workers.handlers.rooms.writes import RoomWrites
from workers.http.auth import require_admin
from workers.http.bodies import json_body
from workers.http.errors import ApiError, checked
from workers.storage import room_deletions as deletions

ROOMS = "/_synapse/admin/v1/rooms"
ROOMS_V2 = "/_synapse/admin/v2/rooms"


class RoomAdmin:
    def __init__(self, pool: asyncpg.Pool, writes: RoomWrites) -> None:
        self._pool = pool
        self._writes = writes

    def routes(self) -> list[web.RouteDef]:
        return [
            web.delete(f"{ROOMS}/{{room_id}}", self.delete),
            web.post(f"{ROOMS}/{{room_id}}/delete", self.delete),
            web.delete(f"{ROOMS_V2}/{{room_id}}", self.start_deletion),
            web.get(f"{ROOMS_V2}/{{room_id}}/delete_status", self.status_by_room),
            web.get(f"{ROOMS_V2}/delete_status/{{delete_id}}", self.status_by_id),
        ]

    async def delete(self, request: web.Request) -> web.Response:
        room_id, options = await self._request(request)
        result = await self._writes.purge(room_id, options)
        return web.json_response(result.to_json())

    async def start_deletion(self, request: web.Request) -> web.Response:
        room_id, options = await self._request(request, body_required=True)
        delete_id = await self._writes.start_deletion(room_id, options)
        return web.json_response({"delete_id": delete_id})

    async def status_by_room(self, request: web.Request) -> web.Response:
        await require_admin(self._pool, request)
        room_id = checked(identifiers.check_room_id, request.match_info["room_id"])
        async with self._pool.acquire() as conn:
            found = await deletions.by_room(conn, room_id)
        if not found:
            raise ApiError(404, "M_NOT_FOUND", f"No delete task for room_id '{room_id}' found")
        return web.json_response({"results": [d.to_json(with_id=True) for d in found]})

    async def status_by_id(self, request: web.Request) -> web.Response:
        await require_admin(self._pool, request)
        delete_id = request.match_info["delete_id"]
        async with self._pool.acquire() as conn:
            found = await deletions.by_id(conn, delete_id)
        if found is None:
            raise ApiError(404, "M_NOT_FOUND", f"delete id '{delete_id}' not found")
        return web.json_response(found.to_json(with_id=False))

    async def _request(self, request: web.Request, body_required: bool = False) -> tuple[str, PurgeOptions]:
        """The room and the options of a delete request (admin only; 400 for a bad body)."""
        who = await require_admin(self._pool, request)
        room_id = checked(identifiers.check_room_id, request.match_info["room_id"])
        if body_required and not request.body_exists:
            raise ApiError(400, "M_NOT_JSON", "The body must be a JSON object, at least {}")
        body = await json_body(request)
        if body.get("new_room_user_id") is not None:
            raise ApiError(
                400, "M_INVALID_PARAM",
                "new_room_user_id is not supported: this server does not create a replacement room",
            )  # fmt: skip
        return room_id, PurgeOptions(_flag(body, "block", False), _flag(body, "purge", True), who.user_id)


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, "M_BAD_JSON", f"Param '{name}' must be a boolean, if given")
    return value
