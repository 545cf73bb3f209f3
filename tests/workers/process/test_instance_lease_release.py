"""workers.process.instance_lease: releasing the name ends the keep-alive even when a cancel is
dropped (Python 3.11's `wait_for` drops one that lands as the renewal completes)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from workers.process.instance_lease import InstanceLease


async def test_a_release_ends_a_keep_alive_that_dropped_one_cancel(
    db_pool: asyncpg.Pool[Any], database_url: str, channel_prefix: str
) -> None:
    lease = await InstanceLease.acquire(database_url, channel_prefix, "w1", 30.0, lambda: None)
    lease._task.cancel()  # the real keep-alive, replaced by one that drops the first cancel
    ran = asyncio.Event()

    async def drops_one_cancel() -> None:
        try:
            ran.set()
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # as wait_for does on 3.11 when its future completes with the cancel
        await asyncio.sleep(3600)

    lease._task = asyncio.create_task(drops_one_cancel())
    await ran.wait()
    started = asyncio.get_running_loop().time()
    release = asyncio.create_task(lease.release())
    done, _ = await asyncio.wait({release}, timeout=5)  # not wait_for: its cancel would end the task
    assert done and asyncio.get_running_loop().time() - started < 4
    assert lease._task.done()
    left = await db_pool.fetchval(
        "SELECT expires_at > now() FROM instance_leases WHERE lease_key = $1", lease.key
    )
    assert left is False  # released: the next process takes the name at once
