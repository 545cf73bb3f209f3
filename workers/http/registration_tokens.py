"""Synapse's admin API for registration tokens (`registration: token`), for server admins only.

* `GET /_synapse/admin/v1/registration_tokens[?valid=true|false]` -> `{"registration_tokens": [...]}`
* `POST /_synapse/admin/v1/registration_tokens/new` `{token?, uses_allowed?, expiry_time?, length?}`
* `GET|PUT|DELETE /_synapse/admin/v1/registration_tokens/{token}` (PUT: `{uses_allowed?, expiry_time?}`)

A token is `{token, uses_allowed, pending, completed, expiry_time}`. The caller's access token
must belong to a server admin (403 M_FORBIDDEN otherwise), as with Synapse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
from aiohttp import web

from workers.http.auth import require_admin
from workers.http.bodies import json_body
from workers.http.errors import ApiError
from workers.storage import registration_tokens as tokens

TOKENS = "/_synapse/admin/v1/registration_tokens"


class RegistrationTokenAdmin:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(TOKENS, self.list),
            web.post(f"{TOKENS}/new", self.create),
            web.get(f"{TOKENS}/{{token}}", self.get),
            web.put(f"{TOKENS}/{{token}}", self.update),
            web.delete(f"{TOKENS}/{{token}}", self.delete),
        ]

    async def _admin(self, request: web.Request) -> None:
        await require_admin(self._pool, request)

    async def list(self, request: web.Request) -> web.Response:
        await self._admin(request)
        valid_text = request.query.get("valid")
        if valid_text not in (None, "true", "false"):
            raise ApiError(400, "M_INVALID_PARAM", "valid must be true or false")
        valid = None if valid_text is None else valid_text == "true"
        async with self._pool.acquire() as conn:
            found = await tokens.list_tokens(conn, valid)
        return web.json_response({"registration_tokens": [t.as_json() for t in found]})

    async def create(self, request: web.Request) -> web.Response:
        await self._admin(request)
        body = await json_body(request)
        if "token" in body:
            token = _param(tokens.check_token_name, body["token"])
        else:
            length = body.get("length", 16)
            if (
                isinstance(length, bool)
                or not isinstance(length, int)
                or not 1 <= length <= tokens.MAX_TOKEN_LENGTH
            ):
                raise ApiError(
                    400, "M_INVALID_PARAM", f"length must be an integer from 1 to {tokens.MAX_TOKEN_LENGTH}"
                )
            token = tokens.random_token(length)
        uses = _param(tokens.check_uses_allowed, body.get("uses_allowed"))
        expiry = _param(tokens.check_expiry_time, body.get("expiry_time"))
        async with self._pool.acquire() as conn:
            try:
                created = await tokens.create(conn, token, uses, expiry)
            except tokens.TokenExistsError as e:
                raise ApiError(400, "M_INVALID_PARAM", str(e)) from None
        return web.json_response(created.as_json())

    async def get(self, request: web.Request) -> web.Response:
        await self._admin(request)
        async with self._pool.acquire() as conn:
            found = await tokens.get(conn, request.match_info["token"])
        return web.json_response(_found(found).as_json())

    async def update(self, request: web.Request) -> web.Response:
        await self._admin(request)
        body = await json_body(request)
        changes: dict[str, int | None] = {}
        if "uses_allowed" in body:
            changes["uses_allowed"] = _param(tokens.check_uses_allowed, body["uses_allowed"])
        if "expiry_time" in body:
            changes["expiry_time"] = _param(tokens.check_expiry_time, body["expiry_time"])
        async with self._pool.acquire() as conn:
            found = await tokens.update(conn, request.match_info["token"], changes)
        return web.json_response(_found(found).as_json())

    async def delete(self, request: web.Request) -> web.Response:
        await self._admin(request)
        async with self._pool.acquire() as conn:
            deleted = await tokens.delete(conn, request.match_info["token"])
        if not deleted:
            raise ApiError(404, "M_NOT_FOUND", "no such registration token")
        return web.json_response({})


def _param(check: Callable[[Any], Any], value: Any) -> Any:
    try:
        return check(value)
    except ValueError as e:
        raise ApiError(400, "M_INVALID_PARAM", str(e)) from None


def _found(token: tokens.RegistrationToken | None) -> tokens.RegistrationToken:
    if token is None:
        raise ApiError(404, "M_NOT_FOUND", "no such registration token")
    return token
