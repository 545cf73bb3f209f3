"""A room's persister stops (SIGTERM) or dies (SIGKILL) while writes to the room arrive at another
worker: the room's lease moves to the other persister (at once on a planned stop; once the dead
one's instance lease expired after a crash), and the writes, idempotent or not, wait for that and
succeed instead of answering 503. With no wait configured they fail with 503."""

from __future__ import annotations

import time

import aiohttp
import asyncpg
import pytest

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import ClusterClient, RequestRefused
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
