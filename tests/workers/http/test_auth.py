"""The access-token look-up: against a real PostgreSQL whose backends end under it, and the cache
of tokens when the caches row that ends one is lost on the way."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import asyncpg
import pytest

from tests.workers.conftest import MakeWorker
from workers.http.auth import lookup
from workers.storage import connect, create_pool, users

C = "/_matrix/client/v3"


def terminate_while_blocked(url: str, pid: int) -> None:
    """End backend `pid` and wait until it is gone, with this thread's event loop blocked: its
    FATAL and the close both sit unread in the pooled connection's socket when the loop resumes."""

    async def terminate() -> None:
        async with connect(url) as admin:
            assert await admin.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)

    thread = threading.Thread(target=asyncio.run, args=(terminate(),))
    thread.start()
    thread.join()


async def idle_backend_ended(pool: asyncpg.Pool, url: str) -> None:
    """The pool's next connection has read its backend's FATAL but not yet the close (two loop turns:
    the first reads the FATAL, the query runs in the second before the close is read)."""
    async with pool.acquire() as conn:  # the pool hands this one out next (last in, first out)
        pid = await conn.fetchval("SELECT pg_backend_pid()")
    terminate_while_blocked(url, pid)
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_a_pooled_connection_whose_backend_ended_is_replaced(database_url: str) -> None:
    async with connect(database_url) as conn:
        await users.create_user(conn, "@a:localhost", None)
        session = await users.new_session(conn, "@a:localhost", "DEV")
    hashed = users.token_hash(session.access_token)
    pool = await create_pool(database_url, 3)
    try:
        # The fault as asyncpg shows it: one task, one connection, and still "another operation".
        await idle_backend_ended(pool, database_url)
        with pytest.raises(asyncpg.InternalClientError, match="another operation"):
            async with pool.acquire() as conn:
                await users.requester_for_hash(conn, hashed)
        # The look-up drops it and reads on a fresh connection.
        for _ in range(3):
            await idle_backend_ended(pool, database_url)
            assert await lookup(pool, hashed) == users.Requester("@a:localhost", "DEV")
    finally:
        await pool.close()


async def test_a_lost_token_end_is_caught_up_from_the_database(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    dropping = False
    writer = await make_worker("p1", ["p1"], drop_filter=lambda _n: dropping)
    reader = await make_worker("r1", ["p1"])
    here, there = (f"http://127.0.0.1:{w.http_port}" for w in (writer, reader))
    register = {"username": "alice", "password": "pw", "auth": {"type": "m.login.dummy"}}
    async with http.post(f"{here}{C}/register", json=register) as resp:
        token = (await resp.json())["access_token"]
    assert await whoami(http, there, token) == 200  # cached on the reader

    dropping = True  # every line the writer publishes is lost: the caches row's RDATA, POSITION too
    async with http.post(f"{here}{C}/logout", json={}, headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200
    assert await whoami(http, here, token) == 401
    await asyncio.sleep(1.0)
    assert await whoami(http, there, token) == 200  # the reader never heard: its cache still holds

    dropping = False  # the next POSITION is beyond the lost row: the reader reads it from the database
    deadline = time.monotonic() + 5.0
    while await whoami(http, there, token) == 200:
        assert time.monotonic() < deadline, "the reader never caught up with the lost token end"
        await asyncio.sleep(0.05)


async def whoami(http: aiohttp.ClientSession, url: str, token: str) -> int:
    async with http.get(f"{url}{C}/account/whoami", headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status
