"""The stand-in federation sender against the real database: it reads its queues once the streams
that feed them moved, not on every tick of a quiet worker, and sweeps them all the same."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from workers.handlers.stored.federation_sender import FederationSenderStandIn


async def _poke(pool: asyncpg.Pool[Any], stream_id: int) -> None:
    await pool.execute(
        "INSERT INTO device_lists_outbound_pokes (stream_id, destination, user_id, instance_name)"
        " VALUES ($1, 'remote.example', '@alice:localhost', 'p1')",
        stream_id,
    )


async def _queued(pool: asyncpg.Pool[Any]) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM device_lists_outbound_pokes"))


async def test_the_queues_are_read_after_their_streams_moved(db_pool: asyncpg.Pool[Any]) -> None:
    positions = {"p1": 5}
    sender = FederationSenderStandIn(db_pool, CollectorRegistry(), lambda: dict(positions))
    await _poke(db_pool, 5)
    assert await sender.drain_if_queued()  # the first drain: whatever was queued before the start
    assert await _queued(db_pool) == 0
    await _poke(db_pool, 6)  # not yet seen in the positions: this worker has not heard of it
    assert not await sender.drain_if_queued()
    assert await _queued(db_pool) == 1
    positions["p1"] = 6
    assert await sender.drain_if_queued()
    assert await _queued(db_pool) == 0
    assert not await sender.drain_if_queued()


async def test_the_sweep_reads_the_queues_whatever_the_positions_say(db_pool: asyncpg.Pool[Any]) -> None:
    sender = FederationSenderStandIn(db_pool, CollectorRegistry(), lambda: 0, sweep_s=0.0)
    assert await sender.drain_if_queued()
    await _poke(db_pool, 7)
    assert await sender.drain_if_queued()
    assert await _queued(db_pool) == 0


async def test_the_loop_outlives_a_statement_timeout_and_a_stuck_connection(
    db_pool: asyncpg.Pool[Any],
) -> None:
    sender = FederationSenderStandIn(db_pool, CollectorRegistry(), lambda: 0, interval_s=0.01)
    failures: list[Exception] = [
        TimeoutError("statement timed out"),
        asyncpg.InternalClientError("in progress"),
    ]
    drained = asyncio.Event()

    async def drain() -> bool:
        if failures:
            raise failures.pop(0)
        drained.set()
        return True

    sender.drain_if_queued = drain  # type: ignore[method-assign]
    sender.start()
    try:
        await asyncio.wait_for(drained.wait(), 5)
    finally:
        await sender.stop()
    assert not failures
