"""The requests a worker is handling, so that shutdown can end them in bounded time.

aiohttp's own shutdown waits `shutdown_timeout` for a running handler, then only marks the request
cancelled and waits as long again before it cancels the handler's task: a handler that waits (a
relayed long-poll, a send waiting to see its event, a write waiting for the caller's positions)
holds the process for twice that. `InFlight.settle(grace_s)` lets the requests in flight finish for
at most `grace_s`, then cancels the rest; each cancelled request answers 503 with `Retry-After`
(the client retries on another worker) instead of losing its connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from workers.http.errors import unavailable

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class InFlight:
    """`middleware` tracks each request's task; `settle()` ends them at shutdown."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()
        self._ending: set[asyncio.Task[object]] = set()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is None:
            return await handler(request)
        self._tasks.add(task)
        try:
            return await handler(request)
        except asyncio.CancelledError:
            if task not in self._ending:
                raise
            task.uncancel()  # our own cancellation, and only that one: answer instead of dropping
            return unavailable("this worker is shutting down", 2).response()
        finally:
            self._tasks.discard(task)

    async def settle(self, grace_s: float) -> None:
        """Until no request is in flight: at most `grace_s` of waiting, then the rest are
        cancelled (each answers 503) and awaited for at most `grace_s` more."""
        pending = {t for t in self._tasks if not t.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=grace_s)
        if not pending:
            return
        log.info("shutdown: ending %d requests still in flight after %.1fs with 503", len(pending), grace_s)
        self._ending |= pending
        for task in pending:
            task.cancel()
        _, stuck = await asyncio.wait(pending, timeout=grace_s)
        if stuck:
            log.warning("shutdown: %d requests did not end when cancelled", len(stuck))
