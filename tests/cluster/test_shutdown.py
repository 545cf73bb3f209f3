"""SIGTERM under load ends in bounded time: real processes with long-polls (local and relayed) and
sends in flight, each stopped worker exits 0 within the documented bound, and no request in
flight is answered 500."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from collections.abc import Awaitable
from typing import Any

import aiohttp

from tests.cluster.conftest import MakeCluster
from workers.app import SHUTDOWN_GRACE_S
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.harness.faultproxy import FaultProxy, target_of, through

#: docs/operations.md ("Stopping a worker"): the grace for requests in flight, then the closing
#: steps, with room for a loaded machine; aiohttp's own shutdown alone took 10 s.
SHUTDOWN_BOUND_S = SHUTDOWN_GRACE_S + 5.0


async def _sigterm_and_time(cluster: LocalCluster, name: str) -> tuple[int | None, float]:
    process = cluster.workers[name].process
    assert process is not None
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    while process.poll() is None and time.monotonic() - started < 30:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return process.poll(), time.monotonic() - started


async def test_sigterm_under_load_exits_within_the_bound(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(
        persisters=2, sync_workers=2, background_workers=0, write_only_persisters=True
    )
    statuses: Counter[str] = Counter()
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        clients = [ClusterClient(session, cluster.urls) for _ in range(6)]
        for i, client in enumerate(clients):
            await client.register(f"user{i}", via="sync2")
        room = await clients[0].create_room("public", via="sync2")
        for client in clients[1:]:
            await client.membership(room, "join", via="sync2")

        async def call(request: Awaitable[Any]) -> Any:
            """The answer, or None after counting how the request failed."""
            try:
                answer = await request
            except RequestRefused as refused:
                statuses[str(refused.status)] += 1
            except aiohttp.ClientError:
                statuses["connection"] += 1  # the worker closed its socket: the client retries
            else:
                statuses["200"] += 1
                return answer
            await asyncio.sleep(0.1)
            return None

        async def poll(client: ClusterClient, via: str) -> None:
            since = None
            while not stop.is_set():
                answer = await call(client.sync(via, since, 30_000))
                since = answer["next_batch"] if answer is not None else since

        async def send(client: ClusterClient, via: str) -> None:
            n = 0
            while not stop.is_set():
                await call(client.send(room, "m.room.message", {"n": n}, via=via))
                n += 1

        idle = [ClusterClient(session, cluster.urls) for _ in range(2)]  # in no room: polls park
        for i, client in enumerate(idle):
            await client.register(f"idle{i}", via="sync2")
        load = [
            asyncio.create_task(work(client, via))
            for via in ("sync1", "sync2", "persister1", "persister2")
            for work, some in ((poll, clients[:3] + idle), (send, clients[:3]))
            for client in some
        ]
        await asyncio.sleep(3)  # long-polls parked, relayed ones among them; sends flowing
        try:
            for name in ("sync1", "persister1"):  # a reader, and a writer with relayed long-polls
                code, took = await _sigterm_and_time(cluster, name)
                print(f"{name} exited {code} {took:.2f}s after SIGTERM")  # shown with -s
                assert code == 0, (name, code, cluster.log_tail(name, 60))
                assert took < SHUTDOWN_BOUND_S, (name, took, cluster.log_tail(name, 60))
                assert "took over" not in cluster.log_path(name).read_text(), cluster.log_tail(name, 60)
                await cluster.start([name])
                await asyncio.sleep(1)
            logs = {name: cluster.log_path(name).read_text() for name in cluster.workers}
        finally:
            stop.set()
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)
    assert statuses["200"] > 0
    assert statuses["500"] == 0, statuses
    for text in logs.values():  # read before the test's own clients hung up
        at = text.find("Traceback")
        assert at < 0, text[max(0, at - 1500) : at + 3000]


async def test_sigterm_ends_within_shutdown_timeout_with_postgres_blackholed(
    make_cluster: MakeCluster, database_url: str
) -> None:
    """A persister whose PostgreSQL link is blackholed (sends in flight, nothing answered, nothing
    closed) still exits within `shutdown_timeout_s` of SIGTERM: its steps that wait on PostgreSQL
    are cut at the deadline, one line names them, and the exit code is 1. It starts again once the
    link is back."""
    timeout_s = 6.0
    async with FaultProxy(*target_of(database_url), postgres=True) as proxy:
        cluster = await make_cluster(
            persisters=2, sync_workers=1, background_workers=0,
            worker_config={"persister1": {"database_url": through(database_url, proxy),
                                          "shutdown_timeout_s": timeout_s}},
        )  # fmt: skip
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            client = ClusterClient(session, cluster.urls)
            await client.register("sender", via="sync1")
            rooms = [await client.create_room("public", via="sync1") for _ in range(6)]

            async def send(room: str) -> None:
                with contextlib.suppress(aiohttp.ClientError, RequestRefused, TimeoutError):
                    await client.send(room, "m.room.message", {"body": "in flight"}, via="persister1")

            proxy.silence()
            sends = [asyncio.create_task(send(room)) for room in rooms]
            await asyncio.sleep(1.0)  # the sends wait on the blackholed link
            code, took = await _sigterm_and_time(cluster, "persister1")
            log = cluster.log_tail("persister1", 80)
            assert took < timeout_s + 1.5, (took, log)
            assert code == 1, (code, log)
            assert "not cleanly" in log and "skipped" in log, log
            assert "Traceback" not in cluster.log_path("persister1").read_text(), log
            for task in sends:
                task.cancel()
            await asyncio.gather(*sends, return_exceptions=True)
            proxy.restore()
            await cluster.start(["persister1"])
