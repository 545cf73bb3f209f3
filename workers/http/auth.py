"""Who is asking: the access token of a client request.

Every worker keeps the owners of recent tokens in memory (`SyncCaches.access_tokens`, keyed by the
token's hex SHA-256, reached through the application's `TOKEN_CACHE`; a write-only worker applies
the caches stream for it): a known token costs no query. A token ends only on its user's
device_lists writer, in one transaction with a caches-stream row naming it (`DeviceLists._delete`):
the worker that took the request drops it at once (`forget_tokens`), every other worker when it
applies that row, within one replication delay (by catch-up from the database if the row's RDATA is
lost). Nothing expires by time. A token without a device (made before devices existed) is never
cached: it can end without a caches row. Elsewhere (no `TOKEN_CACHE`) each request reads
PostgreSQL.

The spec lets a client send the token as `Authorization: Bearer` or as `?access_token=`. A
request that needs the password again (deleting devices, changing the password) confirms it with
user-interactive auth's one stage here (`confirm_password`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import asyncpg
from aiohttp import web

from workers.handlers.caches.lru import LruCache
from workers.http.errors import ApiError, unavailable
from workers.storage import user_admin, users
from workers.storage.passwords import verify_password
from workers.storage.users import Requester

log = logging.getLogger(__name__)

TOKEN_CACHE: web.AppKey[LruCache[str, Requester]] = web.AppKey("token_cache", LruCache)
#: What a pooled connection whose backend the server ended looks like on its next query: asyncpg
#: read the server's FATAL while idle but not yet the close, and the protocol is stuck
#: ("cannot switch to state 12; another operation (2) is in progress"), or the close came first.
_STALE_CONNECTION = (asyncpg.InternalClientError, asyncpg.ConnectionDoesNotExistError)
_PASSWORD_FLOWS = {"flows": [{"stages": ["m.login.password"]}], "params": {}}
#: Request key of an optional `async (Requester) -> None` that runs (once) when the token's owner is known
#: (the per-user rate limit of a route; it raises to refuse).
ON_REQUESTER = "fanout.on_requester"


class _Uncached(Exception):
    """A loader's answer that must not be cached (a token without a device)."""

    def __init__(self, found: Requester) -> None:
        super().__init__(found.user_id)
        self.found = found


def access_token(request: web.Request) -> str:
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "M_MISSING_TOKEN", "send Authorization: Bearer <access token>")
        return token.strip()
    query_token = request.query.get("access_token")
    if not query_token:
        raise ApiError(401, "M_MISSING_TOKEN", "no access token (Authorization: Bearer ...)")
    return query_token


def token_key(token: str) -> str:
    """The token's key in the cache and on the caches stream: its hex SHA-256 (never the token)."""
    return users.token_hash(token).hex()


def _unknown() -> ApiError:
    return ApiError(401, "M_UNKNOWN_TOKEN", "unknown or logged-out access token", soft_logout=False)


async def lookup(pool: asyncpg.Pool, hashed: bytes) -> Requester | None:
    """The token's owner from PostgreSQL. A pooled connection the server ended while it was idle is
    dropped with every other pooled one (they usually end together: a restart, terminated backends)
    and the read runs once more on a fresh connection; 503 if that fails the same way."""
    for attempt in (1, 2):
        try:
            async with pool.acquire() as conn:
                try:
                    return await users.requester_for_hash(conn, hashed)
                except _STALE_CONNECTION:
                    conn.terminate()
                    raise
        except _STALE_CONNECTION as e:
            await pool.expire_connections()
            if attempt == 2:
                log.warning("token look-up: PostgreSQL connection ended twice: %s", e)
                raise unavailable("the database connection was lost; retry", 1) from None
    raise AssertionError("unreachable")


def token_loader(pool: asyncpg.Pool) -> Callable[[str], Awaitable[Requester]]:
    """The cache's loader: the owner of a key; 401 for an unknown token (never cached)."""

    async def load(key: str) -> Requester:
        found = await lookup(pool, bytes.fromhex(key))
        if found is None:
            raise _unknown()
        if found.device_id is None:
            raise _Uncached(found)
        return found

    return load


async def requester(pool: asyncpg.Pool, request: web.Request) -> Requester:
    """The token's owner; 401 M_MISSING_TOKEN or M_UNKNOWN_TOKEN otherwise."""
    found = await _owner(pool, request)
    hook = request.pop(ON_REQUESTER, None)  # once per request, however often the handler asks
    if hook is not None:
        await hook(found)
    return found


async def require_admin(pool: asyncpg.Pool, request: web.Request) -> Requester:
    """The token's owner if a server admin (Synapse's admin API rule); 403 M_FORBIDDEN otherwise."""
    found = await requester(pool, request)
    async with pool.acquire() as conn:
        if not await user_admin.is_admin(conn, found.user_id):
            raise ApiError(403, "M_FORBIDDEN", "You are not a server admin")
    return found


async def _owner(pool: asyncpg.Pool, request: web.Request) -> Requester:
    token = access_token(request)
    cache = request.config_dict.get(TOKEN_CACHE)
    if cache is not None:
        try:
            return await cache.get(token_key(token))
        except _Uncached as e:
            return e.found
    found = await lookup(pool, users.token_hash(token))
    if found is None:
        raise _unknown()
    return found


async def confirm_password(pool: asyncpg.Pool, user_id: str, auth: Any) -> None:
    """User-interactive auth with its one stage, m.login.password, for `user_id`: a 401 with the
    flows (and a session) unless `auth` completes it."""
    if not isinstance(auth, dict) or auth.get("type") != "m.login.password":
        raise ApiError(401, "M_UNAUTHORIZED", "confirm with your password", **_flows(auth))
    identifier = auth.get("identifier")
    name = identifier.get("user") if isinstance(identifier, dict) else auth.get("user")
    password = auth.get("password")
    async with pool.acquire() as conn:
        stored = await users.password_hash(conn, user_id)
    if (
        name not in (user_id, user_id[1:].partition(":")[0])
        or not isinstance(password, str)
        or not await verify_password(password, stored)
    ):
        raise ApiError(401, "M_FORBIDDEN", "invalid password", **_flows(auth))


def _flows(auth: Any) -> dict[str, Any]:
    session = auth.get("session") if isinstance(auth, dict) else None
    return {**_PASSWORD_FLOWS, "session": session if isinstance(session, str) else secrets.token_urlsafe(16)}


def forget_tokens(request: web.Request, keys: Iterable[str] | None) -> None:
    """Drop ended tokens (their keys; None: every one) from this worker's cache at once, not waiting
    for the caches row: the worker that ended a token refuses it from its next request on."""
    cache = request.config_dict.get(TOKEN_CACHE)
    if cache is None:
        return
    if keys is None:
        cache.invalidate_all()
    else:
        cache.invalidate_many(keys)
