"""Writes while PostgreSQL fails under each worker in turn: 503 with Retry-After, never 500.

Real worker processes, each with its own PostgreSQL link through a fault proxy. Senders write
through every worker (messages, topics, account data) while each worker's link is cut in turn,
then every backend of the database is terminated. Every answer is 200 or 503 (with
`retry_after_ms` and Retry-After), no log holds a traceback, and every event answered 200 is in
the database.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import CLIENT, ClusterClient
from workers.harness.faultproxy import FaultProxy, target_of, through

WORKERS = ["persister1", "persister2", "sync1"]
SENDERS = 6
CUT_S = 1.0
BETWEEN_S = 0.7


@pytest.fixture
async def proxies(database_url: str) -> AsyncIterator[dict[str, FaultProxy]]:
    started = {name: await FaultProxy(*target_of(database_url)).start() for name in WORKERS}
    yield started
    for proxy in started.values():
        await proxy.stop()


class Answers:
    """What the senders got: statuses, 503s without a retry hint, event ids answered 200."""

    def __init__(self) -> None:
        self.statuses: Counter[int] = Counter()
        self.without_retry: list[str] = []
        self.event_ids: list[str] = []

    async def request(
        self, session: aiohttp.ClientSession, method: str, url: str, token: str, body: object
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        try:
            async with session.request(method, url, json=body, headers=headers) as resp:
                answer = await resp.json(content_type=None)
                self.statuses[resp.status] += 1
                if resp.status == 503 and not (
                    "Retry-After" in resp.headers and answer.get("retry_after_ms", 0) > 0
                ):
                    self.without_retry.append(f"{url}: {answer}")
                if resp.status == 200 and "event_id" in answer:
                    self.event_ids.append(answer["event_id"])
        except (aiohttp.ClientError, TimeoutError):
            self.statuses[0] += 1


async def send_until(
    stop: asyncio.Event, answers: Answers, session: aiohttp.ClientSession, cluster: LocalCluster,
    client: ClusterClient, owner: ClusterClient, room_id: str,
) -> None:  # fmt: skip
    assert client.token is not None and client.user_id is not None
    n = 0
    while not stop.is_set():
        n += 1
        base = cluster.url(random.choice(WORKERS))
        kind = n % 5
        if kind == 3 and client is not owner:
            kind = 0  # only the room's creator may set its topic
        if kind == 3:
            url = f"{base}{CLIENT}/rooms/{room_id}/state/m.room.topic/"
            body: dict[str, object] = {"topic": f"t{n}"}
            await answers.request(session, "PUT", url, client.token, body)
        elif kind == 4:
            url = f"{base}{CLIENT}/user/{client.user_id}/account_data/org.example.n"
            await answers.request(session, "PUT", url, client.token, {"n": n})
        else:
            url = f"{base}{CLIENT}/rooms/{room_id}/send/m.room.message/{uuid.uuid4().hex}"
            await answers.request(session, "PUT", url, client.token, {"msgtype": "m.text", "body": f"m{n}"})
        await asyncio.sleep(0.01)


async def test_writes_answer_503_never_500_while_each_workers_postgres_fails(
    make_cluster: MakeCluster, database_url: str, proxies: dict[str, FaultProxy]
) -> None:
    cluster = await make_cluster(
        persisters=2,
        sync_workers=1,
        background_workers=0,
        stream_writers={"account_data": ["persister1", "persister2"]},
        worker_config={
            name: {"database_url": through(database_url, proxy), "startup_retry_s": 60}
            for name, proxy in proxies.items()
        },
    )
    answers = Answers()
    stop = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        owner = ClusterClient(session, cluster.urls)
        clients = [owner]
        await owner.register("owner", via="sync1")
        room_id = await owner.create_room("public", via="sync1")
        for i in range(SENDERS):
            client = ClusterClient(session, cluster.urls)
            await client.register(f"sender{i}", via="sync1")
            await client.membership(room_id, "join", via="sync1")
            clients.append(client)
        senders = [
            asyncio.create_task(send_until(stop, answers, session, cluster, client, owner, room_id))
            for client in clients
        ]
        await asyncio.sleep(BETWEEN_S)
        for name in WORKERS:
            proxies[name].cut()
            await asyncio.sleep(CUT_S)
            proxies[name].restore()
            await asyncio.sleep(BETWEEN_S)
        admin = await asyncpg.connect(database_url)
        try:
            terminated = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert terminated > 0
            await asyncio.sleep(BETWEEN_S)
            stop.set()
            await asyncio.gather(*senders)
            await cluster.wait_ready(WORKERS)
            deadline = time.monotonic() + 10
            stored = await admin.fetchval(
                "SELECT count(*) FROM events WHERE event_id = ANY($1::text[])", answers.event_ids
            )
            while stored < len(answers.event_ids) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)  # a forwarded send's answer may precede nothing: look again
                stored = await admin.fetchval(
                    "SELECT count(*) FROM events WHERE event_id = ANY($1::text[])", answers.event_ids
                )
        finally:
            await admin.close()

    print(f"answers by status: {dict(answers.statuses)}")
    assert 500 not in answers.statuses, dict(answers.statuses)
    assert set(answers.statuses) <= {200, 503}, dict(answers.statuses)
    assert answers.statuses[503] > 0, "no write met the faults"
    assert answers.statuses[200] > 0
    assert answers.without_retry == [], answers.without_retry[:5]
    assert stored == len(answers.event_ids)
    for name in cluster.workers:
        log = cluster.log_tail(name, 100_000)
        assert "Traceback" not in log, (name, log[-3000:])
