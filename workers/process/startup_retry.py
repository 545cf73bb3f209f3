"""Start-up connections retried with backoff for a bounded window, then one clear failure.

A cluster starts its servers and workers together, so a worker that finds Postgres or Redis not
yet listening waits for them (0.1 s doubling to 2 s between attempts) up to `window_s`; after that
it raises `Unreachable` naming the server, never a traceback. A failure that names a configuration
error (`startup_errors.refusal`: refused credentials, no such database, not a Redis server) raises
`Refused` at once instead: waiting 30 s for a wrong password helps nobody. One attempt may take
what is left of the window, at least `MIN_ATTEMPT_S`, so a server that accepts the connection and
never answers ends in `Unreachable` too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit

import asyncpg
import redis.asyncio

from workers.process.startup_errors import Refused, Unreachable, refusal

log = logging.getLogger(__name__)
T = TypeVar("T")
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 2.0
#: The least time one attempt gets, also when the window is (nearly) over.
MIN_ATTEMPT_S = 5.0


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
    """`connect()` until it succeeds or `window_s` has passed; then `Unreachable(what at where)`.
    A failure the configuration causes raises `Refused` at once; one outside `retry_on` propagates."""
    deadline = time.monotonic() + window_s
    delay = FIRST_DELAY_S
    while True:
        try:  # a server that accepts and then says nothing must not outlast the window
            return await asyncio.wait_for(connect(), max(deadline - time.monotonic(), MIN_ATTEMPT_S))
        except Exception as e:
            reason = str(e) or type(e).__name__
            if isinstance(e, TimeoutError):
                reason = "no answer"
            refused = refusal(e)
            if refused is not None:
                raise Refused(f"{what} at {where(url)}: {refused}") from None
            if not isinstance(e, retry_on):
                raise
            if time.monotonic() + delay > deadline:
                raise Unreachable(
                    f"{what} at {where(url)} unreachable after {window_s:g}s: {reason}"
                ) from None
            log.warning(
                "start-up: %s at %s unreachable (%s); retrying in %.1fs", what, where(url), reason, delay
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_S)


async def ping_redis(url: str) -> None:
    """One PING on a short-lived connection: is the server there, and do our credentials work?

    RESP2, as the replication transport speaks it: a server that takes `HELLO 3 AUTH` but refuses
    the plain `AUTH <password>` (a password given to a server that has none) fails here, not later."""
    client = redis.asyncio.from_url(url, protocol=2, socket_connect_timeout=5, socket_timeout=5)
    try:
        await client.ping()
    finally:
        await client.aclose()


async def ping_direct_postgres(url: str) -> None:
    """One query on a short-lived connection to `url`, which must reach PostgreSQL itself: raises
    `Refused` when a pooler answers instead. A pooler hands its clients a backend key of its own,
    so the pid PostgreSQL reports for the session differs from the one the connection was given."""
    conn = await asyncpg.connect(url, timeout=5)
    try:
        backend_pid = await conn.fetchval("SELECT pg_backend_pid()")
        if backend_pid != conn.get_server_pid():
            raise Refused(
                f"database_direct_url ({where(url)}) reaches a connection pooler, not PostgreSQL"
                " itself: point it at the server, as the migration lock and the instance-name lease"
                " need one session"
            )
    finally:
        await conn.close()
