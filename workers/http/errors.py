"""Error responses: every error is the spec's `{"errcode": "M_...", "error": "..."}` with a fitting status.

`ApiError` is raised by routes; `api_error_for` maps the errors the handlers raise (room rules, a
full or stopping persister, an unreachable owner) to one, so the client API and the worker-request
routes answer the same failure the same way.

A failure of PostgreSQL or Redis under a request (a lost link, a terminated backend, a refused
connection, a failover, a serialization conflict) is not a bug: it answers 503 `M_UNKNOWN` with
Retry-After, and logs one line without a traceback (at most one per kind of failure every 10 s,
counting the rest). Only what nothing maps is a 500 with its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import asyncpg
import redis.exceptions
from aiohttp import web

from idgen.multi_writer import DATABASE_DOWN
from pubsub.ratelog import RateLimitedLog
from workers.errors import PersisterError, WorkerError
from workers.handlers.placement.forwarding import (
    NOT_OWNER_ERRCODE,
    UNPROCESSED_HEADER,
    WORKER_AUTH_ERRCODE,
    ForwardRefused,
    OwnerUnavailable,
)
from workers.handlers.placement.leases import NotOwner
from workers.handlers.rooms import rules as rooms
from workers.handlers.rooms.persist import PersisterOverloaded

log = logging.getLogger(__name__)
_outages = RateLimitedLog(log)

#: PostgreSQL failures a retry can get past: the server unreachable or restarting, and a
#: transaction it rolled back for a conflict (serialization, deadlock).
_DATABASE_RETRYABLE: tuple[type[Exception], ...] = (*DATABASE_DOWN, asyncpg.TransactionRollbackError)
#: Redis failures a retry can get past: the server unreachable, loading, read-only or failing over.
_REDIS_RETRYABLE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.MasterDownError,
)


class ApiError(WorkerError):
    """Raised by handlers; the middleware turns it into a JSON response."""

    def __init__(
        self, status: int, errcode: str, message: str, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.errcode = errcode
        self.headers = headers
        self.extra = extra

    def response(self) -> web.Response:
        body = {"errcode": self.errcode, "error": str(self), **self.extra}
        return web.json_response(body, status=self.status, headers=self.headers)


def unavailable(message: str, retry_after_s: int, *, unprocessed: bool = False) -> ApiError:
    """503 with Retry-After (seconds) and retry_after_ms: the client should come back later.
    `unprocessed`: the request was refused before anything was done (`UNPROCESSED_HEADER`)."""
    headers = {"Retry-After": str(retry_after_s)}
    if unprocessed:
        headers[UNPROCESSED_HEADER] = "1"
    return ApiError(503, "M_UNKNOWN", message, headers=headers, retry_after_ms=retry_after_s * 1000)


def outage_error(error: BaseException) -> ApiError | None:
    """503 for a PostgreSQL or Redis failure a retry can get past (logged: one line, rate-limited),
    None for anything else."""
    if isinstance(error, _REDIS_RETRYABLE):
        store = "Redis"
    elif isinstance(error, (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)):
        if not isinstance(error, _DATABASE_RETRYABLE):
            return None
        store = "PostgreSQL"
    elif isinstance(error, (OSError, TimeoutError)):
        store = "a server this request needs"  # a connection attempt that failed or timed out
    else:
        return None
    kind = type(error).__name__
    _outages.warning(f"{store}:{kind}", "request failed, %s unavailable: %s: %s", store, kind, error)
    return unavailable(f"{store} is unavailable; retry shortly", 1)


def api_error_for(error: Exception) -> ApiError | None:
    """The answer for an error a handler raised, or None when it is not an expected one (a bug: 500)."""
    if isinstance(error, ApiError):
        return error
    outage = outage_error(error)
    if outage is not None:
        return outage
    if isinstance(error, rooms.UnsupportedRoomVersion):
        return ApiError(400, "M_UNSUPPORTED_ROOM_VERSION", str(error))
    if isinstance(error, rooms.IncompatibleRoomVersion):
        return ApiError(400, "M_INCOMPATIBLE_ROOM_VERSION", str(error))
    if isinstance(error, rooms.BadEvent):
        return ApiError(400, error.errcode, str(error))
    if isinstance(error, rooms.TooLarge):
        return ApiError(413, "M_TOO_LARGE", str(error))
    if isinstance(error, rooms.NotFound):
        return ApiError(404, "M_NOT_FOUND", str(error))
    if isinstance(error, rooms.Forbidden):
        return ApiError(403, error.errcode, str(error))
    if isinstance(error, NotOwner):
        return ApiError(409, NOT_OWNER_ERRCODE, str(error), holder=error.holder)
    if isinstance(error, PersisterOverloaded):
        return unavailable(f"the room's writer is busy ({error}); retry shortly", 1, unprocessed=True)
    if isinstance(error, PersisterError):  # stopping, or no longer holding its lease
        return unavailable(str(error), 2, unprocessed=True)  # not queued, or rolled back
    if isinstance(error, OwnerUnavailable):
        return unavailable(str(error), error.retry_after_s)
    if isinstance(error, ForwardRefused):
        errcode = error.body.get("errcode")
        message = error.body.get("error")
        if errcode == WORKER_AUTH_ERRCODE or (not isinstance(errcode, str) and error.status in (401, 403)):
            return unavailable("worker requests are refused here (worker_secret)", 10)
        return ApiError(
            error.status,
            errcode if isinstance(errcode, str) else "M_UNKNOWN",
            message if isinstance(message, str) else str(error),
        )
    return None


def checked(check: Callable[[str], str], value: str) -> str:
    """`check(value)` (an identifier check), its ValueError as the client's 400 M_INVALID_PARAM."""
    try:
        return check(value)
    except ValueError as e:
        raise ApiError(400, "M_INVALID_PARAM", str(e)) from None
