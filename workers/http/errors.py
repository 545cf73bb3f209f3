"""JSON error responses: every client error is `{"errcode": ..., "error": ...}` with a fitting status."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from workers.errors import WorkerError


class ApiError(WorkerError):
    """Raised by handlers; the middleware turns it into a JSON response."""

    def __init__(self, status: int, errcode: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.errcode = errcode
        self.extra = extra

    def response(self) -> web.Response:
        body = {"errcode": self.errcode, "error": str(self), **self.extra}
        return web.json_response(body, status=self.status)
