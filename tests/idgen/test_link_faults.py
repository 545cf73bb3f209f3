"""The generator when its PostgreSQL link breaks: kept connections the pool took back are never
used, and a position upsert that fails does not fail a write whose rows are in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from idgen import MultiWriterIdGenerator
from workers.harness.faultproxy import FaultProxy, target_of, through

EVENTS = [("events", "instance_name", "stream_ordering")]


@pytest.fixture
async def proxy(database_url: str) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(*target_of(database_url)) as started:
        yield started


@pytest.fixture
async def gen(proxy: FaultProxy, database_url: str) -> AsyncIterator[MultiWriterIdGenerator]:
    pool = await asyncpg.create_pool(through(database_url, proxy), min_size=0, max_size=4)
    assert pool is not None
    made = await MultiWriterIdGenerator.create(
        pool, stream_name="events", instance_name="a", writers=["a"], tables=EVENTS,
        sequence_name="events_stream_seq",
    )  # fmt: skip
    yield made
    await made.close()
    await pool.close()


async def stored_position(db_pool: asyncpg.Pool) -> int:
    value = await db_pool.fetchval(
        "SELECT stream_id FROM stream_positions WHERE stream_name = 'events' AND instance_name = 'a'"
    )
    return int(value)


async def test_kept_connections_whose_link_was_cut_are_never_used(
    gen: MultiWriterIdGenerator, proxy: FaultProxy, db_pool: asyncpg.Pool
) -> None:
    # Two blocks at once: the generator keeps two connections, both idle afterwards.
    async with gen.get_next(), gen.get_next():
        pass
    proxy.cut()  # both die while idle: asyncpg gives them back to the pool and detaches them
    await asyncio.sleep(0.05)
    proxy.restore()
    async with gen.get_next() as stream_id:
        pass
    assert gen.get_current_token() == stream_id == 3
    assert await stored_position(db_pool) == 3


async def test_a_failed_position_upsert_does_not_fail_the_write(
    gen: MultiWriterIdGenerator, proxy: FaultProxy, db_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    async with gen.get_next():
        pass
    async with gen.get_next() as stream_id:
        proxy.cut()  # the rows are in (say); the upsert at the exit cannot reach the database
        await asyncio.sleep(0.05)
    assert gen.get_current_token() == stream_id == 2  # finished, published
    assert await stored_position(db_pool) == 1  # stale: holds readers' start-up back, nothing else
    assert "position upsert failed, the next write retries it" in caplog.text
    assert "Traceback" not in caplog.text
    proxy.restore()
    async with gen.get_next():
        pass
    assert await stored_position(db_pool) == 3
