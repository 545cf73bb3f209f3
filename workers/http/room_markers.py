"""Where a user has read up to in a room (`/_matrix/client/v3/rooms/{roomId}/...`).

* `POST /read_markers` `{"m.fully_read"?, "m.read"?, "m.read.private"?: event id}` -> `{}`: the
  fully-read marker goes into the room's account data as `m.fully_read` `{"event_id"}` (on the
  user's account_data writer; a direct PUT of that type stays refused as server-managed); `m.read`
  and `m.read.private` are unthreaded receipts. Other keys are ignored, as the spec lets receipt
  types grow.
* `POST /receipt/{receiptType}/{eventId}` `{"thread_id"?}` -> `{}`: a receipt (`m.read`,
  `m.read.private`) on the room's receipts writer (`workers.handlers.stored.receipts`), or the read marker
  (`m.fully_read`, which takes no thread).
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.stored.account_data import AccountData
from workers.handlers.stored.receipts import RECEIPT_TYPES, ReceiptRefused, Receipts
from workers.http.auth import requester
from workers.http.bodies import json_body
from workers.http.errors import ApiError, checked, unavailable

log = logging.getLogger(__name__)
CLIENT = "/_matrix/client/v3"
ROOM = CLIENT + "/rooms/{room_id}"
FULLY_READ = "m.fully_read"
#: Longest thread id taken (the receipts stream's rows carry it).
MAX_THREAD_ID = 255


class RoomMarkerRoutes:
    def __init__(self, pool: asyncpg.Pool, account_data: AccountData, receipts: Receipts | None) -> None:
        self._pool = pool
        self._data = account_data
        self._receipts = receipts

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(f"{ROOM}/read_markers", self.read_markers),
            web.post(f"{ROOM}/receipt/{{receipt_type}}/{{event_id}}", self.receipt),
        ]

    async def receipt(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        room_id = checked(identifiers.check_room_id, request.match_info["room_id"])
        event_id = checked(identifiers.check_event_id, request.match_info["event_id"])
        receipt_type = request.match_info["receipt_type"]
        if receipt_type not in (*RECEIPT_TYPES, FULLY_READ):
            raise ApiError(400, "M_UNKNOWN", f"receipt type must be one of {[*RECEIPT_TYPES, FULLY_READ]}")
        body = await json_body(request)
        thread_id = body.get("thread_id")
        if thread_id is not None:
            if (
                not isinstance(thread_id, str)
                or not thread_id
                or len(thread_id) > MAX_THREAD_ID
                or not thread_id.isprintable()
            ):
                raise ApiError(400, "M_INVALID_PARAM", "thread_id must be a non-empty string")
            if receipt_type == FULLY_READ:
                raise ApiError(400, "M_INVALID_PARAM", f"{FULLY_READ} takes no thread_id")
        if receipt_type == FULLY_READ:
            await self._data.put(who.user_id, room_id, FULLY_READ, {"event_id": event_id})
        else:
            await self._put_receipt(room_id, receipt_type, who.user_id, event_id, thread_id)
        return web.json_response({})

    async def _put_receipt(
        self, room_id: str, receipt_type: str, user_id: str, event_id: str, thread_id: str | None
    ) -> None:
        if self._receipts is None:
            raise unavailable("receipts are not served by this worker", 10)
        try:
            await self._receipts.put(room_id, receipt_type, user_id, event_id, thread_id)
        except ReceiptRefused as e:
            raise ApiError(e.status, e.errcode, str(e)) from None

    async def read_markers(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        room_id = checked(identifiers.check_room_id, request.match_info["room_id"])
        body = await json_body(request)
        fully_read = _event_id(body, FULLY_READ)
        receipts = {kind: _event_id(body, kind) for kind in RECEIPT_TYPES}
        if fully_read is not None:
            await self._data.put(who.user_id, room_id, FULLY_READ, {"event_id": fully_read})
        for kind, event_id in receipts.items():
            if event_id is not None:
                await self._put_receipt(room_id, kind, who.user_id, event_id, None)
        return web.json_response({})


def _event_id(body: dict[str, Any], key: str) -> str | None:
    """The event id under `key` (None when absent); 400 M_INVALID_PARAM when it is not one."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(400, "M_INVALID_PARAM", f"{key} must be an event id")
    return checked(identifiers.check_event_id, value)
