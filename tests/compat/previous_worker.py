"""A worker of the previous release as the database sees it: its instance name's row, held with a
session advisory lock on a connection of its own (what 0.1.0's `InstanceLease` does)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import asyncpg


@contextlib.asynccontextmanager
async def previous_release_worker(database_url: str, lease_key: str) -> AsyncIterator[None]:
    """Holds `lease_key` (`<channel_prefix>/<name>`) as a worker of the previous release until the
    block ends (its session ends: the lock is released, as when such a worker exits or dies)."""
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, 0))", lease_key)
        await conn.execute(
            "INSERT INTO instance_leases (lease_key, pid, host) VALUES ($1, $2, 'previous-release')"
            " ON CONFLICT (lease_key) DO UPDATE SET pid = $2",
            lease_key,
            os.getpid(),
        )
        yield
    finally:
        await conn.close()
