"""Where a user has read up to in a room (`/_matrix/client/v3/rooms/{roomId}/...`).

* `POST /read_markers` `{"m.fully_read"?, "m.read"?, "m.read.private"?: event id}` -> `{}`: the
  fully-read marker goes into the room's account data as `m.fully_read` `{"event_id"}` (on the
  user's account_data writer; a direct PUT of that type stays refused as server-managed). Other
  keys are ignored, as the spec lets receipt types grow.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.account_data import AccountData
from workers.http.auth import requester
from workers.http.bodies import json_body
from workers.http.errors import ApiError, checked

log = logging.getLogger(__name__)
CLIENT = "/_matrix/client/v3"
ROOM = CLIENT + "/rooms/{room_id}"
FULLY_READ = "m.fully_read"
RECEIPT_KEYS = ("m.read", "m.read.private")


class RoomMarkerRoutes:
    def __init__(self, pool: asyncpg.Pool, account_data: AccountData) -> None:
        self._pool = pool
        self._data = account_data

    def routes(self) -> list[web.RouteDef]:
        return [web.post(f"{ROOM}/read_markers", self.read_markers)]

    async def read_markers(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        room_id = checked(identifiers.check_room_id, request.match_info["room_id"])
        body = await json_body(request)
        fully_read = _event_id(body, FULLY_READ)
        for key in RECEIPT_KEYS:
            _event_id(body, key)
        if fully_read is not None:
            await self._data.put(who.user_id, room_id, FULLY_READ, {"event_id": fully_read})
        return web.json_response({})


def _event_id(body: dict[str, Any], key: str) -> str | None:
    """The event id under `key` (None when absent); 400 M_INVALID_PARAM when it is not one."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(400, "M_INVALID_PARAM", f"{key} must be an event id")
    return checked(identifiers.check_event_id, value)
