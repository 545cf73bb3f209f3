"""Admin and test paths outside `/_matrix`.

* `POST /_fanout/admin/v1/rooms/{room_id}/backfill` `{"events": [{"type", "content"}, ...]}`:
  import history into a room the caller (an access token) is joined to. The events get negative
  stream orderings: older than anything live, never in /sync, shown by /messages. Answers
  `{"stream_orderings": [...]}`. Forwarded to the room's persister like any room write.
* `POST /_fanout/admin/v1/device_lists/{userId}/stale`: mark a remote user's cached device list
  stale, as a device-list update from its server would; the next /keys/query resyncs it.
* Synapse's registration-token admin API, `/_synapse/admin/v1/registration_tokens...`
  (`workers.http.registration_tokens`), for server admins.
* Synapse's Delete Room API, `DELETE /_synapse/admin/v1/rooms/{roomId}` (`workers.http.room_admin`),
  for server admins.
"""

from __future__ import annotations

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.rooms.writes import RoomWrites
from workers.http.auth import requester
from workers.http.bodies import json_body
from workers.http.errors import ApiError
from workers.http.registration_tokens import RegistrationTokenAdmin
from workers.http.room_admin import RoomAdmin
from workers.storage import devices

ADMIN = "/_fanout/admin/v1"


class AdminRoutes:
    def __init__(self, pool: asyncpg.Pool, writes: RoomWrites) -> None:
        self._pool = pool
        self._writes = writes

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(f"{ADMIN}/rooms/{{room_id}}/backfill", self.backfill),
            web.post(f"{ADMIN}/device_lists/{{user_id}}/stale", self.mark_stale),
            *RegistrationTokenAdmin(self._pool).routes(),
            *RoomAdmin(self._pool, self._writes).routes(),
        ]

    async def mark_stale(self, request: web.Request) -> web.Response:
        """Mark a remote user's cached device list stale (what a device-list update from its server
        would do): the next /keys/query resyncs it through the device-list writer."""
        await requester(self._pool, request)
        async with self._pool.acquire() as conn:
            await devices.mark_remote_stale(conn, request.match_info["user_id"])
        return web.json_response({})

    async def backfill(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        try:
            room_id = identifiers.check_room_id(request.match_info["room_id"])
        except ValueError as e:
            raise ApiError(400, "M_INVALID_PARAM", str(e)) from None
        body = await json_body(request, max_bytes=1 << 20)
        orderings = await self._writes.backfill(room_id, who.user_id, body.get("events"))
        return web.json_response({"stream_orderings": orderings})
