"""The start-up hint check on a real database and Redis: hints beyond the sequence are deleted with a
warning, the others (and what is not a number) are left alone, for a negative stream too; a Redis
that never answers does not hold start-up."""

from __future__ import annotations

import logging
import time

import asyncpg
import pytest
import redis.asyncio as aioredis

from idgen import MultiWriterIdGenerator
from pubsub import keys
from workers.harness.faultproxy import FaultProxy, target_of, through
from workers.process import position_hints
from workers.process.position_hints import discard_hints_ahead


async def generator(pool: asyncpg.Pool, stream: str, sequence: str, positive: bool) -> MultiWriterIdGenerator:
    return await MultiWriterIdGenerator.create(
        pool, stream_name=stream, instance_name="w1", writers=["w1"], sequence_name=sequence,
        tables=[("events", "instance_name", "stream_ordering")], positive=positive,
    )  # fmt: skip


async def test_hints_beyond_the_sequence_are_discarded(
    db_pool: asyncpg.Pool, redis_url: str, channel_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    events = await generator(db_pool, "events", "events_stream_seq", True)
    backfill = await generator(db_pool, "backfill", "events_backfill_stream_seq", False)
    for gen in (events, backfill):
        for _ in range(3):
            async with gen.get_next():
                pass
    client = aioredis.from_url(redis_url)
    try:
        events_key = keys.positions_key(channel_prefix, "events")
        backfill_key = keys.positions_key(channel_prefix, "backfill")
        await client.hset(events_key, mapping={"w1": "3", "old": "900", "odd": "x"})
        await client.hset(backfill_key, mapping={"w1": "3", "old": "4"})  # wire tokens: -ID
        caplog.set_level(logging.WARNING, "workers.process.position_hints")
        found = await discard_hints_ahead(client, channel_prefix, {"events": events, "backfill": backfill})
        assert found == {"events": {"old": 900}, "backfill": {"old": 4}}
        assert await client.hgetall(events_key) == {b"w1": b"3", b"odd": b"x"}
        assert await client.hgetall(backfill_key) == {b"w1": b"3"}
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 2 and all("beyond the database's sequence" in w for w in warnings), warnings
        assert await discard_hints_ahead(client, channel_prefix, {"events": events}) == {}
    finally:
        await client.aclose()
        await events.close()
        await backfill.close()


async def test_a_silent_redis_does_not_hold_start_up(
    db_pool: asyncpg.Pool,
    redis_url: str,
    channel_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis accepts the connection but never answers: the check gives up, start-up goes on."""
    monkeypatch.setattr(position_hints, "CHECK_TIMEOUT_S", 0.5)
    events = await generator(db_pool, "events", "events_stream_seq", True)
    async with FaultProxy(*target_of(redis_url)) as proxy:
        client = aioredis.from_url(through(redis_url, proxy))
        try:
            await client.ping()
            proxy.silence()
            started = time.monotonic()
            assert await discard_hints_ahead(client, channel_prefix, {"events": events}) == {}
            assert time.monotonic() - started < 3
            assert "could not check the position hints in Redis (no answer)" in caplog.text
        finally:
            await client.aclose()
            await events.close()
