"""Error responses: every error is the spec's `{"errcode": "M_...", "error": "..."}` with a fitting status.

`ApiError` is raised by routes; `api_error_for` maps the errors the handlers raise (room rules, a
full or stopping persister, an unreachable owner) to one, so the client API and the worker-request
routes answer the same failure the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from workers.errors import WorkerError
from workers.handlers import rooms
from workers.handlers.forwarding import WORKER_AUTH_ERRCODE, ForwardRefused, OwnerUnavailable
from workers.handlers.persist import PersisterOverloaded, PersisterStopped


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


def unavailable(message: str, retry_after_s: int) -> ApiError:
    """503 with Retry-After (seconds) and retry_after_ms: the client should come back later."""
    return ApiError(
        503,
        "M_UNKNOWN",
        message,
        headers={"Retry-After": str(retry_after_s)},
        retry_after_ms=retry_after_s * 1000,
    )


def api_error_for(error: Exception) -> ApiError | None:
    """The answer for an error a handler raised, or None when it is not an expected one (a bug: 500)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, rooms.UnsupportedRoomVersion):
        return ApiError(400, "M_UNSUPPORTED_ROOM_VERSION", str(error))
    if isinstance(error, rooms.IncompatibleRoomVersion):
        return ApiError(400, "M_INCOMPATIBLE_ROOM_VERSION", str(error))
    if isinstance(error, rooms.BadEvent):
        return ApiError(400, "M_BAD_JSON", str(error))
    if isinstance(error, rooms.NotFound):
        return ApiError(404, "M_NOT_FOUND", str(error))
    if isinstance(error, rooms.Forbidden):
        return ApiError(403, "M_FORBIDDEN", str(error))
    if isinstance(error, PersisterOverloaded):
        return unavailable(f"the room's writer is busy ({error}); retry shortly", 1)
    if isinstance(error, PersisterStopped):
        return unavailable(str(error), 2)
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
