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


async def test_the_running_recorder_writes_each_advance_and_nothing_while_quiet(
    db_pool: asyncpg.Pool,
) -> None:
    """The task wakes on a change, not on a clock: an advance reaches the table (within a flush
    interval), and a quiet recorder leaves the row's `updated_ts` as it was."""
    recorder = AppliedRangesRecorder(db_pool, "r1", "caches", flush_interval_s=0.05)
    recorder.begin("p1", 0)
    recorder.start()
    query = "SELECT to_id, updated_ts FROM replication_applied_ranges WHERE worker_name = 'r1'"
    try:
        for position in (3, 8):
            recorder.advanced("p1", position)
            for _ in range(500):
                row = await db_pool.fetchrow(query)
                if row is not None and row["to_id"] == position:
                    break
                await asyncio.sleep(0.01)
            assert row is not None and row["to_id"] == position
        recorder.advanced("p1", 8)  # not an advance
        await asyncio.sleep(0.2)  # four flush intervals
        assert await db_pool.fetchrow(query) == row
    finally:
        await recorder.stop()
