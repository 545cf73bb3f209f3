"""Storage: the schema migrations (`migrations/*.sql`, applied by `migrate.py`) and one module of SQL
per domain. Functions take a connection, never a pool, so the caller decides what runs in one
transaction. Storage imports nothing of `workers` but `model`; never `http`, `handlers` or `harness`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from workers.storage.named_pool import NamedPool

#: A plain connection or one borrowed from a pool.
Conn: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"


async def _keep_session(conn: asyncpg.Connection[Any]) -> None:
    """Pool reset hook: nothing to undo. Our code never changes session state on pooled connections
    (no SET, LISTEN, temporary tables or session locks left behind), so the default reset query
    would be one more round trip on every release for nothing. asyncpg still rolls back a
    transaction left open and clears listeners before calling this."""


async def create_pool(url: str, max_size: int) -> NamedPool:
    """The worker's connection pool (its transactions named and timed once it has a timer).
    Built as `asyncpg.create_pool` builds it, with its defaults, only of the subclass."""
    pool = NamedPool(
        url, min_size=2, max_size=max_size, reset=_keep_session, max_queries=50_000,
        max_inactive_connection_lifetime=300.0, loop=None, connection_class=asyncpg.Connection,
        record_class=asyncpg.Record,
    )  # fmt: skip
    await pool
    return pool


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[asyncpg.Connection[Any]]:
    """One short-lived connection (tools, tests, the demo); workers use their pool."""
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()
