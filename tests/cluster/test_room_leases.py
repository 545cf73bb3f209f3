"""Room leases with real persisters: a room's persister stops (SIGTERM) or dies (SIGKILL) while
writes to the room arrive at another worker: the room's lease moves to the other persister (at
once on a planned stop; once the dead one's instance lease expired after a crash), and the writes,
idempotent or not, wait for that and succeed instead of answering 503 (with no wait configured
they fail with 503). A frozen persister whose room moved cannot commit its pending write there."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.cluster.conftest import MakeCluster
from tests.compat.previous_worker import previous_release_worker
from tests.workers.worker_process import until_blocked_on_lock
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.process.previous_release import CHECK_INTERVAL_S
from workers.routing import writer_for_room

LEASE_S = 2.0


async def _room(
    cluster: LocalCluster, session: aiohttp.ClientSession
) -> tuple[ClusterClient, ClusterClient, str]:
    alice = ClusterClient(session, cluster.urls)
    bob = ClusterClient(session, cluster.urls)
    await alice.register("alice", via="sync1")
    await bob.register("bob", via="sync1")
    return alice, bob, await alice.create_room("public", via="sync1")


async def _writers(database_url: str, room: str) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT instance_name FROM events WHERE room_id = $1 ORDER BY stream_ordering", room
        )
        return [r["instance_name"] for r in rows]
    finally:
        await conn.close()


@pytest.mark.parametrize("crash", [False, True])
async def test_a_rooms_writes_move_to_another_persister(
    make_cluster: MakeCluster, database_url: str, crash: bool
) -> None:
    cluster = await make_cluster(
        persisters=2, sync_workers=1, background_workers=0,
        extra_config={"writer_wait_s": 10.0, "instance_lease_s": LEASE_S},
    )  # fmt: skip
    async with aiohttp.ClientSession() as session:
        alice, bob, room = await _room(cluster, session)
        owner = writer_for_room(room, cluster.event_writers)
        other = next(w for w in cluster.event_writers if w != owner)
        await alice.send(room, "m.room.message", {"body": "before"}, via="sync1")
        if crash:
            cluster.kill(owner)
        else:
            assert await cluster.stop(names=[owner]) == {owner: 0}
        started = time.monotonic()
        sent = await alice.send(room, "m.room.message", {"body": "during"}, via="sync1")
        joined = await bob.membership(room, "join", via="sync1")  # not idempotent
        waited = time.monotonic() - started
        assert sent["event_id"] and joined["room_id"] == room
        # A planned stop hands the room over at once; a crash only once the lease expired.
        assert waited < (LEASE_S + 8 if crash else 8), waited
        await cluster.start([owner])
        await alice.send(room, "m.room.message", {"body": "after"}, via="sync1")
        page = await alice.messages(room, via="sync1", dir="b", limit=10)
        bodies = [e["content"].get("body") for e in reversed(page["chunk"]) if e["type"] == "m.room.message"]
    assert bodies == ["before", "during", "after"]
    writers = await _writers(database_url, room)
    assert writers[-3:] == [other, other, other], writers  # the room stayed with its new holder
    assert set(writers[:-3]) == {owner}


async def test_with_no_wait_a_stopped_persisters_rooms_answer_503(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(
        persisters=2, sync_workers=1, background_workers=0, extra_config={"writer_wait_s": 0.0}
    )
    async with aiohttp.ClientSession() as session:
        alice, _, room = await _room(cluster, session)
        owner = writer_for_room(room, cluster.event_writers)
        cluster.kill(owner)
        with pytest.raises(RequestRefused) as down:
            await alice.send(room, "m.room.message", {"body": "during"}, via="sync1")
        assert down.value.status == 503
        await cluster.start([owner])


async def test_a_write_of_a_frozen_persister_whose_room_moved_does_not_commit(
    make_cluster: MakeCluster, database_url: str
) -> None:
    """persister's join is held inside its transaction (a table lock the test holds) while the
    persister is frozen past its instance lease; a send moves the room to the other persister.
    Nobody took the frozen one's name, so it runs on once resumed, but its join must fail its
    room-lease check and never commit (it would land behind the new holder's events). The
    forwarding worker may repeat the join on the new holder (it carries its event id): that copy
    is the only one that may commit, and the frozen one's then meets it (lease check or unique
    event id) and commits nothing. `tests/workers/handlers/rooms/test_persist.py` covers the lease
    check alone."""
    cluster = await make_cluster(
        persisters=2, sync_workers=1, background_workers=0,
        extra_config={"writer_wait_s": 15.0, "instance_lease_s": LEASE_S, "worker_request_timeout_s": 2.0},
    )  # fmt: skip
    admin = await asyncpg.connect(database_url)
    try:
        async with aiohttp.ClientSession() as session:
            alice, bob, room = await _room(cluster, session)
            owner = writer_for_room(room, cluster.event_writers)
            other = next(w for w in cluster.event_writers if w != owner)
            process = cluster.workers[owner].process
            assert process is not None
            lock = admin.transaction()
            await lock.start()
            await admin.execute("LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE")
            join = asyncio.create_task(bob.membership(room, "join", via="sync1"))
            await until_blocked_on_lock(admin)
            process.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(LEASE_S + 1)
                send = asyncio.create_task(alice.send(room, "m.room.message", {"body": "moved"}, via="sync1"))
                await _until_held_by(admin, room, other)
                await lock.rollback()  # the new holder's send and the frozen one's join both run on
                sent = await send
            finally:
                process.send_signal(signal.SIGCONT)
            outcome = (await asyncio.gather(join, return_exceptions=True))[0]
            await asyncio.sleep(1.0)  # the resumed persister's batch has failed by now
        joined_by = await admin.fetch(
            "SELECT instance_name FROM events WHERE room_id = $1 AND type = 'm.room.member'"
            " AND state_key = $2",
            room, bob.user_id,
        )  # fmt: skip
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, RequestRefused) and outcome.status == 503, outcome
            assert joined_by == []
        else:
            assert [r["instance_name"] for r in joined_by] == [other]
        writer = await admin.fetchval(
            "SELECT instance_name FROM events WHERE event_id = $1", sent["event_id"]
        )
        assert writer == other
        assert process.poll() is None  # its name was never taken: it serves on
    finally:
        await admin.close()


async def _until_held_by(conn: asyncpg.Connection[Any], room: str, writer: str) -> None:
    for _ in range(400):
        if await conn.fetchval("SELECT writer FROM room_leases WHERE room_id = $1", room) == writer:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{room} never moved to {writer}")


async def test_while_a_previous_release_worker_runs_a_stopped_persisters_rooms_stay(
    make_cluster: MakeCluster, database_url: str, channel_prefix: str
) -> None:
    """Workers of the previous release route by the stable hash: while one runs, a persister's
    rooms wait for it across its restart instead of moving; once none runs, rooms move again."""
    async with aiohttp.ClientSession() as session:
        async with previous_release_worker(database_url, f"{channel_prefix}/old1"):
            cluster = await make_cluster(
                persisters=2, sync_workers=1, background_workers=0,
                extra_config={"writer_wait_s": 30.0, "instance_lease_s": LEASE_S},
            )  # fmt: skip
            alice, _, room = await _room(cluster, session)
            owner = writer_for_room(room, cluster.event_writers)
            other = next(w for w in cluster.event_writers if w != owner)
            await alice.send(room, "m.room.message", {"body": "before"}, via="sync1")
            assert await cluster.stop(names=[owner]) == {owner: 0}
            during = asyncio.create_task(alice.send(room, "m.room.message", {"body": "during"}, via="sync1"))
            await asyncio.sleep(1.0)
            assert not during.done()  # waits for its writer: the room is not taken elsewhere
            await cluster.start([owner])
            assert (await during)["event_id"]
            assert set(await _writers(database_url, room)) == {owner}
        # The previous release's worker is gone: the next stop hands the room over as usual.
        await asyncio.sleep(CHECK_INTERVAL_S * 2)
        assert await cluster.stop(names=[owner]) == {owner: 0}
        await alice.send(room, "m.room.message", {"body": "after"}, via="sync1")
    assert (await _writers(database_url, room))[-1] == other


async def test_a_room_that_moved_shows_its_history_before_a_join_on_its_new_writer(
    make_cluster: MakeCluster,
) -> None:
    """A shared-history room written by one persister, then (that persister stopped) by the other,
    where bob joins: bob's next sync from before the first writer's messages shows them with his
    join. The sync worker's position of the stopped persister stays below bob's join, so the
    window ends there for that writer: whether bob joined inside the window is read in the room's
    own order (its events are in stream order across writers), not against that writer's end."""
    cluster = await make_cluster(
        persisters=2, sync_workers=1, background_workers=0, extra_config={"writer_wait_s": 10.0}
    )
    async with aiohttp.ClientSession() as session:
        alice, bob, room = await _room(cluster, session)
        owner = writer_for_room(room, cluster.event_writers)
        before = (await bob.sync(via="sync1"))["next_batch"]
        sent = [
            (await alice.send(room, "m.room.message", {"body": f"m{i}"}, via="sync1"))["event_id"]
            for i in range(3)
        ]
        assert await cluster.stop(names=[owner]) == {owner: 0}
        await bob.membership(room, "join", via="sync1")
        body = await bob.sync(since=before, via="sync1")
    timeline = body["rooms"]["join"][room]["timeline"]["events"]
    assert [e["event_id"] for e in timeline[-4:-1]] == sent, timeline
    join = timeline[-1]
    assert (join["type"], join["state_key"]) == ("m.room.member", bob.user_id)
    assert join["content"]["membership"] == "join"
