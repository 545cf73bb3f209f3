"""The access-token look-up against a real PostgreSQL whose backends end under it."""

from __future__ import annotations

import asyncio
import threading

import asyncpg
import pytest

from workers.http.auth import lookup
from workers.storage import connect, create_pool, users


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
