"""The worker cluster as real subprocesses: exactly-once delivery, crashes, idle writers, privacy."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from tests.cluster.conftest import MakeCluster
from tests.conftest import both_backends
from tests.pubsub.conftest import publish_raw
from workers.harness.cluster_client import ClusterClient, RequestRefused, timeline_events
from workers.harness.loadgen import LoadDriver, LoadPlan
from workers.routing import writer_for_room
from workers.storage import connect

PLAN = LoadPlan(users=8, rooms=6, rooms_per_user=3, actions=400, concurrency=8, sync_timeout_ms=500)


@both_backends
async def test_exactly_once_in_order_under_two_persisters(
    make_cluster: MakeCluster, database_url: str
) -> None:
    cluster = await make_cluster(background_workers=0)
    async with aiohttp.ClientSession() as session:
        driver = LoadDriver(
            session, cluster.urls, cluster.event_writers, cluster.sync_workers, database_url, PLAN
        )
        await driver.setup()
        report = await driver.run()
    assert report.problems == []
    # Sends are about half of the 400 actions (racing membership pairs and churn take the rest).
    assert report.events_sent > 150 and report.syncs > 50
    async with connect(database_url) as conn:
        writers = await conn.fetch(
            "SELECT DISTINCT room_id, instance_name FROM events WHERE type = 'm.room.message'"
        )
    # Each room's messages come from the persister it hashes to (both were up throughout), so both
    # write whenever the rooms' hashes name both (not always: the room ids are random).
    assert {r["instance_name"] for r in writers} == {
        writer_for_room(r["room_id"], cluster.event_writers) for r in writers
    }
    assert len({r["room_id"] for r in writers}) == len(writers)  # one writer per room


async def test_persister_killed_mid_load_and_restarted(make_cluster: MakeCluster, database_url: str) -> None:
    cluster = await make_cluster(background_workers=0)
    plan = LoadPlan(users=8, rooms=6, rooms_per_user=3, actions=900, concurrency=6, sync_timeout_ms=500)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        driver = LoadDriver(
            session, cluster.urls, cluster.event_writers, cluster.sync_workers, database_url, plan
        )
        await driver.setup()
        load = asyncio.create_task(driver.run())
        await _wait_until(lambda: driver.report.events_sent >= 150)
        cluster.kill("persister1")
        async with connect(database_url) as conn:
            top_at_kill = await conn.fetchval("SELECT max(stream_ordering) FROM events")
        restarted_ms = int(time.time() * 1000)
        await cluster.start(["persister1"])
        report = await load
        # The load may have run out while persister1 was down (refused sends fail fast): write to
        # its rooms now, so the check below always has rows from after the restart. The load's
        # rooms have random ids and all hash to persister2 in about 1 run of 128; a room made on
        # persister1 is its own.
        owned = [
            (client, room)
            for client in driver.clients
            for room in sorted(driver.joined[str(client.user_id)])
            if writer_for_room(room, cluster.event_writers) == "persister1"
        ]
        owner = driver.clients[0]
        fresh = await owner.create_room("public", via="persister1")
        assert writer_for_room(fresh, cluster.event_writers) == "persister1"
        for client, room in [*owned[:4], (owner, fresh)]:
            await client.send(room, "m.room.message", {"after": "restart"})
    assert report.problems == []
    async with connect(database_url) as conn:
        after = await conn.fetchval(
            "SELECT min(stream_ordering) FROM events WHERE instance_name = 'persister1' AND received_ts > $1",
            restarted_ms,
        )
        duplicates = await conn.fetchval("SELECT count(*) - count(DISTINCT stream_ordering) FROM events")
    assert after is not None and after > top_at_kill  # no ID handed out again after the crash
    assert duplicates == 0


async def test_idle_writer_does_not_hold_back_readers_or_background(
    make_cluster: MakeCluster, database_url: str
) -> None:
    cluster = await make_cluster(sync_workers=1)
    async with aiohttp.ClientSession() as session:
        alice = ClusterClient(session, cluster.urls, cluster.event_writers)
        await alice.register("@alice", via="persister1")
        since = (await alice.sync("sync1"))["next_batch"]
        room = await alice.create_room("public", via="persister1")  # persister2 stays idle throughout
        for i in range(30):
            await alice.send(room, "m.room.message", {"n": i})
        async with connect(database_url) as conn:
            top = await conn.fetchval("SELECT max(stream_ordering) FROM events")
            assert await conn.fetchval("SELECT count(*) FROM events WHERE instance_name = 'persister2'") == 0

        async def background_reached_top() -> bool:
            async with connect(database_url) as conn:
                position = await conn.fetchval("SELECT coalesce(max(position), 0) FROM background_progress")
            return bool(position >= top)

        await _wait_until(background_reached_top)
        health = await cluster.health("sync1")
        assert health["persisted_upto"]["events"] >= top  # the linear position is not stuck on persister2
        result = await alice.sync("sync1", since, 1000)
        assert sum(1 for e in timeline_events(result) if e["type"] == "m.room.message") == 30


async def test_user_cannot_read_another_users_room(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(persisters=1, sync_workers=1, background_workers=0)
    async with aiohttp.ClientSession() as session:
        alice = ClusterClient(session, cluster.urls, cluster.event_writers)
        mallory = ClusterClient(session, cluster.urls, cluster.event_writers)
        await alice.register("@alice")
        await mallory.register("@mallory")
        since = (await mallory.sync("sync1"))["next_batch"]
        room = await alice.create_room("invite")
        await alice.send(room, "m.room.message", {"body": "private"})
        with pytest.raises(RequestRefused) as refused:
            await mallory.room_state(room, "sync1")
        assert refused.value.status == 403
        with pytest.raises(RequestRefused) as refused:
            await mallory.membership(room, "join")
        assert refused.value.status == 403
        seen = await mallory.sync("sync1", since, 500)
        assert timeline_events(seen) == [] and seen["rooms"]["invite"] == {}


async def test_a_send_retried_across_a_killed_persister_is_one_event(
    make_cluster: MakeCluster, database_url: str
) -> None:
    """The client's retry of a PUT with the same txnId, made through a sync worker: refused with a
    503 while the persister is dead (SIGKILL), answered with the first event once it is back."""
    cluster = await make_cluster(
        persisters=1, sync_workers=1, background_workers=0, extra_config={"writer_wait_s": 0}
    )
    async with aiohttp.ClientSession() as session:
        alice = ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        room = await alice.create_room("public", via="sync1")
        first = await alice.send(room, "m.room.message", {"body": "k"}, txn_id="k1", via="sync1")
        cluster.kill("persister1")
        with pytest.raises(RequestRefused) as down:
            await alice.send(room, "m.room.message", {"body": "k"}, txn_id="k1", via="sync1")
        assert (down.value.status, down.value.errcode) == (503, "M_UNKNOWN")
        await cluster.start(["persister1"])
        again = await alice.send(room, "m.room.message", {"body": "k"}, txn_id="k1", via="sync1")
    assert again["event_id"] == first["event_id"]
    async with connect(database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM events WHERE type = 'm.room.message'") == 1


async def test_a_forged_position_under_a_running_writers_name_stops_nothing(
    make_cluster: MakeCluster, redis_url: str, channel_prefix: str
) -> None:
    """Issue 24's forged echo: one POSITION under persister1's own name, far beyond anything. The
    real persister1 ignores it (its positions come from its commits) and raises the alarm; readers
    refuse it (beyond the sequence); every later send answers 200 and is delivered. One of 2**63
    under the same name is no position at all: refused as malformed with its reason, no alarm."""
    cluster = await make_cluster(persisters=1, sync_workers=1, background_workers=0)
    async with aiohttp.ClientSession() as session:
        alice = ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        room = await alice.create_room("public", via="sync1")
        since = (await alice.sync("sync1"))["next_batch"]
        await publish_raw(
            redis_url,
            channel_prefix,
            [b"POSITION events persister1 70 1000000000000000", b"POSITION events persister1 0 %d" % 2**63],
        )
        for i in range(10):
            await alice.send(room, "m.room.message", {"n": i}, via="persister1" if i % 2 else "sync1")
        got: list[int] = []
        while len(got) < 10:
            result = await alice.sync("sync1", since, 2000)
            since = result["next_batch"]
            got += [e["content"]["n"] for e in timeline_events(result) if e["type"] == "m.room.message"]
        assert got == list(range(10))
        async with session.get(f"{cluster.url('persister1')}/metrics") as resp:
            metrics = await resp.text()
    assert 'fanout_repl_rejected_total{reason="conflicting_own_name"} 1.0' in metrics
    assert 'fanout_repl_rejected_total{reason="token_too_large"} 1.0' in metrics
    log = cluster.log_tail("persister1", 200)
    assert "ALARM" in log and "reason=token_too_large" in log


async def _wait_until(condition: Callable[[], bool | Awaitable[bool]], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if await result if inspect.isawaitable(result) else result:
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_a_port_another_process_took_first_makes_the_cluster_start_again_elsewhere(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process binds a port the harness picked for sync1 before sync1 does, and answers
    /health 200 as a worker of another cluster would: the harness must not take it for sync1
    (its pid is not sync1's), and starts the cluster again on new ports."""
    from aiohttp import web

    import workers.harness.cluster as harness

    async def foreign_health(request: web.Request) -> web.Response:
        return web.json_response({"ready": True, "instance": "sync1", "pid": 1})

    app = web.Application()
    app.router.add_get("/health", foreign_health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    taken = runner.addresses[0][1]
    real_free_port = harness.free_port
    picks = iter([real_free_port(), real_free_port(), taken])  # persister1, persister2, sync1
    monkeypatch.setattr(harness, "free_port", lambda: next(picks, None) or real_free_port())
    try:
        cluster = await make_cluster(background_workers=0)
        assert cluster.workers["sync1"].port != taken
        assert b"HTTP port busy" in cluster.log_path("sync1").read_bytes()
        for name in cluster.workers:
            health = await cluster.health(name)
            process = cluster.workers[name].process
            assert process is not None and health["pid"] == process.pid and health["instance"] == name
    finally:
        await runner.cleanup()
