"""Who is asking: the access token of a client request, looked up on every request.

Tokens are not cached in the process: a logout on one worker must end the token on every worker
at once, and one indexed look-up per request is cheaper than a cross-worker invalidation.
The spec lets a client send the token as `Authorization: Bearer` or as `?access_token=`.
"""

from __future__ import annotations

import asyncpg
from aiohttp import web

from workers.http.errors import ApiError
from workers.storage import users
from workers.storage.users import Requester

#: Request key of an optional `async (Requester) -> None` that runs (once) when the token's owner is known
#: (the per-user rate limit of a route; it raises to refuse).
ON_REQUESTER = "fanout.on_requester"


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


async def requester(pool: asyncpg.Pool, request: web.Request) -> Requester:
    """The token's owner; 401 M_MISSING_TOKEN or M_UNKNOWN_TOKEN otherwise."""
    token = access_token(request)
    async with pool.acquire() as conn:
        found = await users.requester_for_token(conn, token)
    if found is None:
        raise ApiError(401, "M_UNKNOWN_TOKEN", "unknown or logged-out access token", soft_logout=False)
    hook = request.pop(ON_REQUESTER, None)  # once per request, however often the handler asks
    if hook is not None:
        await hook(found)
    return found
