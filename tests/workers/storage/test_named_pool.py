"""Every database transaction named and timed: names from where the block is opened (through
asyncpg's helpers too) or given, the histogram by name, one log line and one count per slow
transaction, and on a real worker the start-up transactions (migrations, the instance lease, the ID
generators' loads and their lanes' statements) and the requests' ones in /metrics, a cache's load
named after the storage function it runs."""

from __future__ import annotations

import asyncio
import logging
import re

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from tests.workers.conftest import MakeWorker
from workers.storage import create_pool
from workers.storage.named_pool import TransactionTimer

HERE = __name__


async def test_names_durations_and_the_slow_log(database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    pool = await create_pool(database_url, 2)
    pool.timer = TransactionTimer(registry, slow_s=0.2)
    try:
        with caplog.at_level(logging.WARNING, logger="workers.storage.named_pool"):
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute("SELECT pg_sleep(0.3)")
            assert await pool.fetchval("SELECT 1") == 1  # asyncpg acquires inside: still named here
            conn = await pool.acquire()  # a held connection is not a transaction: not timed
            await pool.release(conn)
            async with pool.acquire(name="given") as conn:
                await conn.execute("SELECT 1")
            pool.timer.observe_held("held", 0.25)  # its owner timed a statement on a held connection
    finally:
        await pool.close()
    name = f"{HERE}.test_names_durations_and_the_slow_log"
    count = registry.get_sample_value("fanout_db_transaction_seconds_count", {"name": name})
    total = registry.get_sample_value("fanout_db_transaction_seconds_sum", {"name": name})
    assert count == 2 and total is not None and 0.3 <= total < 2
    assert registry.get_sample_value("fanout_db_transaction_seconds_count", {"name": "given"}) == 1
    assert registry.get_sample_value("fanout_db_transaction_seconds_sum", {"name": "held"}) == 0.25
    assert registry.get_sample_value("fanout_db_pool_wait_seconds_count") == 3  # held: no pool wait
    slow = [r.getMessage() for r in caplog.records]
    assert len(slow) == 2 and re.fullmatch(
        rf"slow database transaction name={name} took=0\.3\d\ds waited=\S+", slow[0]
    )
    assert slow[1] == "slow database transaction name=held took=0.250s"
    assert registry.get_sample_value("fanout_db_slow_transactions_total", {"name": name}) == 1
    assert registry.get_sample_value("fanout_db_slow_transactions_total", {"name": "held"}) == 1


async def test_a_worker_names_its_start_up_and_request_transactions(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"], instance_lease_s=1)  # the lease's keep-alive every 1/3 s
    base = f"http://127.0.0.1:{worker.http_port}"
    body = {"username": "alice", "password": "pw", "auth": {"type": "m.login.dummy"}}
    async with http.post(f"{base}/_matrix/client/v3/register", json=body) as resp:
        assert resp.status == 200
        token = (await resp.json())["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    async with http.get(f"{base}/_matrix/client/v3/sync", params={"timeout": "0"}, headers=headers) as resp:
        assert resp.status == 200  # loads the user's rooms into the cache: a block named after its read
    await asyncio.sleep(0.5)
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    names = set(re.findall(r'^fanout_db_transaction_seconds_count\{name="([^"]+)"\} ', text, re.MULTILINE))
    start_up = {
        "workers.storage.migrate.apply_migrations",
        "workers.process.instance_lease.InstanceLease.acquire",
        "workers.process.instance_lease.InstanceLease._keep",
        "idgen.instance_map.InstanceMap.get_id",
        "idgen.multi_writer.MultiWriterIdGenerator._allocate",  # the sequence, on the lane
        "idgen.multi_writer.MultiWriterIdGenerator._persist_own_position",
    }
    requests = {"workers.http.accounts.Accounts._create", "workers.storage.events.user_rooms"}
    assert start_up | requests <= names, sorted(names)
    assert not any(n.startswith("workers.app.Worker.start") for n in names), sorted(names)


async def test_behind_a_transaction_pooler_the_direct_sessions_are_timed_too(
    make_worker: MakeWorker, http: aiohttp.ClientSession, database_url: str
) -> None:
    """With `database_pooler: transaction` the migrations and the direct URL's check run on
    connections of their own (here the direct URL and the pooled one are the same server)."""
    direct_url = database_url + ("&" if "?" in database_url else "?") + "application_name=direct"
    worker = await make_worker("p1", ["p1"], database_pooler="transaction", database_direct_url=direct_url)
    async with http.get(f"http://127.0.0.1:{worker.http_port}/metrics") as resp:
        text = await resp.text()
    names = set(re.findall(r'^fanout_db_transaction_seconds_count\{name="([^"]+)"\} ', text, re.MULTILINE))
    direct = {
        "workers.storage.migrate.apply_migrations",
        "workers.process.startup_retry.ping_direct_postgres",
    }
    assert direct <= names, sorted(names)
