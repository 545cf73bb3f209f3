"""The fault proxy between a client and real servers: cut, silence, delay, throttle, restore, and
the PostgreSQL message rules."""

from __future__ import annotations

import asyncio
import struct
import time

import asyncpg
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from workers.harness.faultproxy import FaultProxy, OnMessage, target_of, through
from workers.harness.pg_messages import FrontendMessages, is_commit, is_copy_done


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


async def _table(database_url: str) -> asyncpg.Connection:
    admin = await asyncpg.connect(database_url)
    await admin.execute("CREATE TABLE IF NOT EXISTS proxy_marks (mark TEXT NOT NULL)")
    return admin


async def _marked_transaction(proxy: FaultProxy, database_url: str, mark: str) -> BaseException | None:
    """One transaction through the proxy inserting `mark`; the error it ended with, if any."""
    conn = await asyncpg.connect(through(database_url, proxy))
    try:
        async with conn.transaction():
            await conn.execute("INSERT INTO proxy_marks VALUES ($1)", mark)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        return e
    finally:
        conn.terminate()
    return None


async def test_postgres_rules_drop_the_answer_to_a_commit_or_the_commit_itself(database_url: str) -> None:
    admin = await _table(database_url)
    try:
        async with FaultProxy(*target_of(database_url), postgres=True) as proxy:
            # Only the connection that sent the marker: a COMMIT elsewhere goes through.
            fired = proxy.on_message(is_commit, OnMessage.DROP_REPLY, after=b"mark-1")
            assert await _marked_transaction(proxy, database_url, "mark-0") is None
            assert not fired.is_set()
            error = await _marked_transaction(proxy, database_url, "mark-1")
            assert fired.is_set() and error is not None
            # The server got the COMMIT (its backend stays, the proxy holds its side open).
            await asyncio.sleep(0.1)
            assert await admin.fetchval("SELECT count(*) FROM proxy_marks WHERE mark = 'mark-1'") == 1
            assert proxy.open_connections == 1

            fired = proxy.on_message(is_commit, OnMessage.NEVER_ARRIVES, after=b"mark-2")
            error = await _marked_transaction(proxy, database_url, "mark-2")
            assert fired.is_set() and error is not None
            await asyncio.sleep(0.1)
            assert await admin.fetchval("SELECT count(*) FROM proxy_marks WHERE mark = 'mark-2'") == 0
            # The backend waits in its transaction, the row invisible, until someone ends it.
            idle = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                " AND query LIKE 'INSERT INTO proxy_marks%'"
            )
            assert idle == 1

            fired = proxy.on_message(is_commit, OnMessage.LATE, after=b"mark-3", late_s=0.2)
            error = await _marked_transaction(proxy, database_url, "mark-3")
            assert fired.is_set() and error is not None
            assert await admin.fetchval("SELECT count(*) FROM proxy_marks WHERE mark = 'mark-3'") == 0
            await asyncio.sleep(0.4)
            assert await admin.fetchval("SELECT count(*) FROM proxy_marks WHERE mark = 'mark-3'") == 1
    finally:
        await admin.close()


def test_frontend_messages_are_split_whatever_the_chunks() -> None:
    startup = struct.pack("!ii", 8, 80877103) + struct.pack("!ii", 9, 196608) + b"\x00"
    query = b"Q" + struct.pack("!i", 4 + 8) + b"COMMIT;\x00"
    stream = startup + query + b"c" + struct.pack("!i", 4)
    for size in (1, 3, 7, len(stream)):
        parser = FrontendMessages()
        messages = [m for i in range(0, len(stream), size) for m in parser.feed(stream[i : i + size])]
        assert [m.kind for m in messages] == [b"", b"", b"Q", b"c"]
        assert b"".join(m.raw for m in messages) == stream
        assert [is_commit(m) for m in messages] == [False, False, True, False]
        assert is_copy_done(messages[-1])
    # TLS after an SSLRequest: the rest passes untouched.
    parser = FrontendMessages()
    parser.feed(struct.pack("!ii", 8, 80877103))
    hello = b"\x16\x03\x01\x02\x00" + b"\x01" * 20
    assert [m.raw for m in parser.feed(hello)] == [hello]
