"""Storage: migrations and one module of SQL per domain. Functions take a connection, never a pool,
so the caller decides what runs in one transaction."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

#: A plain connection or one borrowed from a pool.
Conn: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[asyncpg.Connection[Any]]:
    """One short-lived connection (tools, tests, the demo); workers use their pool."""
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()
