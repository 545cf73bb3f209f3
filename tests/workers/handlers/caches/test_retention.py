"""Invalidation-log retention against the real database: rows older than the cutoff go, in
batches smaller than the backlog; newer rows stay, and so does the newest row however old (where a
worker starts the stream); the background task prunes by age on its own."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg

from workers.handlers.caches.retention import DAY_MS, InvalidationRetentionTask, prune_older_than


async def _insert(pool: asyncpg.Pool[Any], timestamps: list[int]) -> None:
    await pool.executemany(
        "INSERT INTO cache_invalidation_stream_by_instance"
        " (stream_id, instance_name, cache_func, keys, invalidation_ts) VALUES ($1, 'p1', 'f', '{k}', $2)",
        list(enumerate(timestamps, start=1)),
    )


async def _remaining(pool: asyncpg.Pool[Any]) -> list[int]:
    rows = await pool.fetch("SELECT invalidation_ts FROM cache_invalidation_stream_by_instance ORDER BY 1")
    return [row[0] for row in rows]


async def test_prune_deletes_only_older_rows_in_batches(db_pool: asyncpg.Pool[Any]) -> None:
    await _insert(db_pool, [100] * 7 + [200, 300])
    assert await prune_older_than(db_pool, 200, batch=3) == 7
    assert await _remaining(db_pool) == [200, 300]
    assert await prune_older_than(db_pool, 200, batch=3) == 0


async def test_the_background_task_prunes_by_age(db_pool: asyncpg.Pool[Any]) -> None:
    now = int(time.time() * 1000)
    await _insert(db_pool, [now - 3 * DAY_MS, now - 2 * DAY_MS, now - DAY_MS // 2, now])
    task = InvalidationRetentionTask(db_pool, retention_days=1, batch=1, interval_s=0.05)
    task.start()
    try:
        for _ in range(500):  # up to 10 s
            if task.pruned >= 2:
                break
            await asyncio.sleep(0.02)
    finally:
        await task.stop()
    assert task.pruned == 2
    assert await _remaining(db_pool) == [now - DAY_MS // 2, now]


async def test_the_newest_row_stays_however_old(db_pool: asyncpg.Pool[Any]) -> None:
    """Where a restarted worker starts the caches stream: pruned, the stream would start below the
    tokens clients hold."""
    await _insert(db_pool, [100, 100, 100])
    assert await prune_older_than(db_pool, 1_000, batch=2) == 2
    rows = await db_pool.fetch("SELECT stream_id FROM cache_invalidation_stream_by_instance")
    assert [r["stream_id"] for r in rows] == [3]
    assert await prune_older_than(db_pool, 1_000, batch=2) == 0
