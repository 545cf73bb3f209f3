"""The audit's record of applied caches rows (`AppliedRangesRecorder`) on a real database."""

from __future__ import annotations

import asyncio

import asyncpg

from workers.handlers.caches.applied import AppliedRangesRecorder


async def test_an_advance_during_a_flush_is_written_by_the_next_flush(db_pool: asyncpg.Pool) -> None:
    recorder = AppliedRangesRecorder(db_pool, "r1", "caches")
    recorder.begin("p1", 0)
    recorder.advanced("p1", 4)
    flushing = asyncio.create_task(recorder.flush())
    await asyncio.sleep(0)  # the flush is now waiting on the database with to_id 4
    recorder.advanced("p1", 6)
    await flushing
    await recorder.flush()
    async with db_pool.acquire() as conn:
        to_id = await conn.fetchval(
            "SELECT to_id FROM replication_applied_ranges WHERE worker_name = 'r1' AND instance_name = 'p1'"
        )
    assert to_id == 6
