"""Account data and room tags (`/_matrix/client/v3/user/{userId}/...`).

* `PUT|GET /user/{userId}/account_data/{type}`: the user's global account data of that type (the
  body is the content, a JSON object).
* `PUT|GET /user/{userId}/rooms/{roomId}/account_data/{type}`: the same for one room.
* `GET /user/{userId}/rooms/{roomId}/tags` -> `{"tags": {tag: {"order"?: number}}}`;
  `PUT|DELETE .../tags/{tag}` (PUT's body is the tag's content, `order` a number when present).
A user reads and writes only their own (403 M_FORBIDDEN); a type the server manages
(`m.fully_read`, `m.push_rules`) cannot be set here (405 M_BAD_JSON); nothing stored: 404 M_NOT_FOUND.
Changes reach /sync's `account_data` (and each joined room's, with `m.tag`) on every worker.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.stored.account_data import SERVER_MANAGED, AccountData
from workers.http.auth import requester
from workers.http.bodies import json_body
from workers.http.errors import ApiError, checked

CLIENT = "/_matrix/client/v3"
USER = f"{CLIENT}/user/{{user_id}}"
ROOM = f"{USER}/rooms/{{room_id}}"
MAX_CONTENT_BYTES = 64 * 1024


class AccountDataRoutes:
    def __init__(self, pool: asyncpg.Pool, account_data: AccountData) -> None:
        self._pool = pool
        self._data = account_data

    def routes(self) -> list[web.RouteDef]:
        return [
            web.put(f"{USER}/account_data/{{type}}", self.put),
            web.get(f"{USER}/account_data/{{type}}", self.get),
            web.put(f"{ROOM}/account_data/{{type}}", self.put),
            web.get(f"{ROOM}/account_data/{{type}}", self.get),
            web.get(f"{ROOM}/tags", self.tags),
            web.put(f"{ROOM}/tags/{{tag}}", self.put_tag),
            web.delete(f"{ROOM}/tags/{{tag}}", self.delete_tag),
        ]

    async def _own(self, request: web.Request) -> tuple[str, str | None]:
        """(the requester, the room of the path or None), after the checks every route makes."""
        who = await requester(self._pool, request)
        if request.match_info["user_id"] != who.user_id:
            raise ApiError(403, "M_FORBIDDEN", "you can only see and change your own account data")
        room = request.match_info.get("room_id")
        return who.user_id, None if room is None else checked(identifiers.check_room_id, room)

    @staticmethod
    def _type(request: web.Request) -> str:
        return checked(identifiers.check_event_type, request.match_info["type"])

    async def put(self, request: web.Request) -> web.Response:
        user_id, room_id = await self._own(request)
        kind = self._type(request)
        if kind in SERVER_MANAGED:
            raise ApiError(405, "M_BAD_JSON", f"{kind} is managed by the server; it cannot be set here")
        content = await json_body(request, MAX_CONTENT_BYTES)
        await self._data.put(user_id, room_id, kind, content)
        return web.json_response({})

    async def get(self, request: web.Request) -> web.Response:
        user_id, room_id = await self._own(request)
        content = await self._data.get(user_id, room_id, self._type(request))
        if content is None:
            raise ApiError(404, "M_NOT_FOUND", "no account data of that type")
        return web.json_response(content)

    async def tags(self, request: web.Request) -> web.Response:
        user_id, room_id = await self._own(request)
        assert room_id is not None  # the route has one
        return web.json_response({"tags": await self._data.tags(user_id, room_id)})

    async def put_tag(self, request: web.Request) -> web.Response:
        user_id, room_id = await self._own(request)
        assert room_id is not None
        tag = _tag(request)
        content = await json_body(request, MAX_CONTENT_BYTES)
        order: Any = content.get("order")
        if order is not None and (not isinstance(order, int | float) or isinstance(order, bool)):
            raise ApiError(400, "M_BAD_JSON", "order must be a number")
        await self._data.set_tag(user_id, room_id, tag, content)
        return web.json_response({})

    async def delete_tag(self, request: web.Request) -> web.Response:
        user_id, room_id = await self._own(request)
        assert room_id is not None
        await self._data.set_tag(user_id, room_id, _tag(request), None)
        return web.json_response({})


def _tag(request: web.Request) -> str:
    tag = request.match_info["tag"]
    if not tag or len(tag) > identifiers.MAX_ID_LENGTH:
        raise ApiError(400, "M_INVALID_PARAM", "a tag is 1 to 255 characters")
    return tag
