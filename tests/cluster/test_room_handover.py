"""A room's order across a change of writer, when the old writer died before it published.

Real persisters and sync workers, Redis behind fault proxies (one for the persisters, one for the
sync workers). Inside a Redis outage the room's persister commits sends it can never publish, and
is SIGKILLed; the room moves to the other persister (once the dead one's instance lease expired),
which writes new events. Every reader's history must show the room's events in stream order,
each once, none missing: the old writer's last events before the new writer's first.

`returned`: the dead persister came back once (while the sync workers were still cut off) and
announced its position to the other persister, then died again, so the new writer saw its last
events announced; otherwise the new writer never heard of them (it fences the old one).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import ClusterClient, timeline_events
from workers.harness.faultproxy import FaultProxy, target_of, through
from workers.routing import writer_for_room

LEASE_S = 2.0


async def _stream_order(database_url: str, room: str, after: int) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT event_id FROM events WHERE room_id = $1 AND stream_ordering > $2"
            " ORDER BY stream_ordering",
            room, after,
        )  # fmt: skip
        return [r["event_id"] for r in rows]
    finally:
        await conn.close()


async def _last_ordering(database_url: str, room: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval("SELECT max(stream_ordering) FROM events WHERE room_id = $1", room))
    finally:
        await conn.close()


class Reader:
    """One user's incremental /sync history of one room through one sync worker."""

    def __init__(self, client: ClusterClient, via: str, room: str) -> None:
        self.client, self.via, self.room = client, via, room
        self.since = ""
        self.history: list[str] = []

    async def start(self) -> None:
        self.since = (await self.client.sync(via=self.via))["next_batch"]

    async def until(self, event_ids: list[str], within_s: float) -> None:
        """Sync until every one of `event_ids` was delivered (or `within_s` passed)."""
        deadline = time.monotonic() + within_s
        while not set(event_ids) <= set(self.history) and time.monotonic() < deadline:
            body = await self.client.sync(via=self.via, since=self.since, timeout_ms=500)
            self.since = body["next_batch"]
            self.history += [e["event_id"] for e in timeline_events(body) if e["room_id"] == self.room]


async def _send(client: ClusterClient, room: str, label: str, count: int) -> list[str]:
    return [
        (await client.send(room, "m.room.message", {"body": f"{label}{i}"}, via="sync1"))["event_id"]
        for i in range(count)
    ]


@pytest.mark.parametrize("returned", [True, False], ids=["returned-once", "never-heard"])
async def test_a_dead_writers_unpublished_events_come_before_the_new_writers(
    make_cluster: MakeCluster, database_url: str, redis_url: str, returned: bool
) -> None:
    writers_redis = await FaultProxy(*target_of(redis_url)).start()
    readers_redis = await FaultProxy(*target_of(redis_url)).start()
    try:
        cluster = await make_cluster(
            persisters=2, sync_workers=2, background_workers=0,
            extra_config={"writer_wait_s": 10.0, "instance_lease_s": LEASE_S},
            worker_config={
                **{p: {"redis_url": through(redis_url, writers_redis)} for p in ("persister1", "persister2")},
                **{s: {"redis_url": through(redis_url, readers_redis)} for s in ("sync1", "sync2")},
            },
        )  # fmt: skip
        await _run(cluster, database_url, writers_redis, readers_redis, returned)
    finally:
        await writers_redis.stop()
        await readers_redis.stop()


async def _run(
    cluster: LocalCluster,
    database_url: str,
    writers_redis: FaultProxy,
    readers_redis: FaultProxy,
    returned: bool,
) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        alice = ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        room = await alice.create_room("public", via="sync1")
        readers: list[Reader] = []
        for name, via in (("bob", "sync1"), ("carol", "sync2")):
            client = ClusterClient(session, cluster.urls)
            await client.register(name, via=via)
            await client.membership(room, "join", via=via)
            readers.append(Reader(client, via, room))
        owner = writer_for_room(room, cluster.event_writers)
        await _send(alice, room, "before", 3)
        start = await _last_ordering(database_url, room)
        for reader in readers:
            await reader.start()
        sent = await _send(alice, room, "seen", 3)

        writers_redis.cut()
        readers_redis.cut()
        sent += await _send(alice, room, "unpublished", 10)  # committed, never published
        cluster.kill(owner)
        writers_redis.restore()
        if returned:  # back once: the other persister hears its position, the readers do not
            await cluster.start([owner])
            cluster.kill(owner)
        await asyncio.sleep(LEASE_S + 0.5)
        moved = await _send(alice, room, "moved", 10)  # on the other persister
        sent += moved
        readers_redis.restore()
        for reader in readers:  # the new writer's events reach the readers: with what came before?
            await reader.until(moved, 20.0)
        await cluster.start([owner])
        sent += await _send(alice, room, "after", 2)
        for reader in readers:
            await reader.until(sent, 20.0)

    order = await _stream_order(database_url, room, start)
    assert set(sent) <= set(order)
    for reader in readers:
        assert reader.history == order, (reader.via, _explain(reader.history, order))


def _explain(history: list[str], order: list[str]) -> dict[str, Any]:
    position = {event: i for i, event in enumerate(order)}
    behind = [
        event
        for i, event in enumerate(history)
        if any(position.get(earlier, -1) > position.get(event, -1) for earlier in history[:i])
    ]
    return {
        "missing": len(set(order) - set(history)),
        "duplicated": len(history) - len(set(history)),
        "delivered_behind_a_later_event": len(behind),
        "history_positions": [position.get(e, -1) for e in history],
    }
