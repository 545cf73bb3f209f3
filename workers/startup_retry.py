"""Start-up connections retried with backoff for a bounded window, then one clear failure.

A cluster starts its servers and workers together, so a worker that finds Postgres or Redis not
yet listening waits for them (0.1 s doubling to 2 s between attempts) up to `window_s`; after that
it raises `Unreachable` naming the server, never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit

from workers.startup_errors import Unreachable

log = logging.getLogger(__name__)
T = TypeVar("T")
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 2.0


def where(url: str) -> str:
    """host:port (or the socket path) of a server URL, without credentials."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return parts.path or url.split("@")[-1]
    return f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname


async def connect_with_retry(
    what: str,
    url: str,
    connect: Callable[[], Awaitable[T]],
    window_s: float,
    retry_on: tuple[type[BaseException], ...],
) -> T:
    """`connect()` until it succeeds or `window_s` has passed; then `Unreachable(what at where)`."""
    deadline = time.monotonic() + window_s
    delay = FIRST_DELAY_S
    while True:
        try:
            return await connect()
        except retry_on as e:
            reason = str(e) or type(e).__name__
            if time.monotonic() + delay > deadline:
                raise Unreachable(
                    f"{what} at {where(url)} unreachable after {window_s:g}s: {reason}"
                ) from None
            log.warning(
                "start-up: %s at %s unreachable (%s); retrying in %.1fs", what, where(url), reason, delay
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_S)
