"""The fault proxy between a client and real servers: cut, silence, delay, throttle, restore."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from workers.harness.faultproxy import FaultProxy, target_of, through


async def test_redis_through_the_proxy_cut_then_restored(redis_url: str) -> None:
    async with FaultProxy(*target_of(redis_url)) as proxy:
        client = aioredis.from_url(through(redis_url, proxy), socket_timeout=2, retry_on_timeout=False)
        try:
            assert await client.ping()
            proxy.cut()
            with pytest.raises((RedisConnectionError, RedisTimeoutError)):
                await client.ping()
            proxy.restore()
            assert await client.ping()
            assert proxy.connections_accepted >= 2
        finally:
            await client.aclose()


async def test_silenced_link_stays_open_but_answers_nothing(redis_url: str) -> None:
    async with FaultProxy(*target_of(redis_url)) as proxy:
        client = aioredis.from_url(through(redis_url, proxy), socket_timeout=0.5)
        try:
            assert await client.ping()
            proxy.silence()
            with pytest.raises(RedisTimeoutError):
                await client.ping()
            assert proxy.open_connections >= 1  # silent, not closed
            proxy.restore()
            await asyncio.sleep(0)
            assert await aioredis.from_url(through(redis_url, proxy)).ping()
        finally:
            await client.aclose()


async def test_delay_holds_each_round_trip(redis_url: str) -> None:
    async with FaultProxy(*target_of(redis_url)) as proxy:
        client = aioredis.from_url(through(redis_url, proxy))
        try:
            await client.ping()
            proxy.delay(0.2)
            started = time.monotonic()
            await client.ping()
            assert time.monotonic() - started >= 0.4  # 0.2 s each way
            proxy.restore()
            started = time.monotonic()
            await client.ping()
            assert time.monotonic() - started < 0.2
        finally:
            await client.aclose()


async def test_throttle_bounds_the_rate(redis_url: str) -> None:
    async with FaultProxy(*target_of(redis_url)) as proxy:
        client = aioredis.from_url(through(redis_url, proxy))
        try:
            await client.set("fanout-test-proxy", b"x" * 200_000)
            proxy.throttle(200_000)
            started = time.monotonic()
            assert len(await client.get("fanout-test-proxy") or b"") == 200_000
            assert time.monotonic() - started >= 0.8
        finally:
            await client.delete("fanout-test-proxy")
            await client.aclose()


async def test_postgres_connection_cut_mid_session_and_a_new_one_after_restore(database_url: str) -> None:
    async with FaultProxy(*target_of(database_url)) as proxy:
        conn = await asyncpg.connect(through(database_url, proxy))
        try:
            assert await conn.fetchval("SELECT 1") == 1
            proxy.cut()
            with pytest.raises((asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError)):
                await conn.fetchval("SELECT 1", timeout=5)
            with pytest.raises((OSError, asyncpg.PostgresConnectionError, asyncio.TimeoutError)):
                await asyncpg.connect(through(database_url, proxy), timeout=2)
            proxy.restore()
            again = await asyncpg.connect(through(database_url, proxy))
            assert await again.fetchval("SELECT 2") == 2
            await again.close()
        finally:
            conn.terminate()
