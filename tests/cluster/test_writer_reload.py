"""`stream_writers` changed online (config reload, SIGHUP) on real processes: a persister added
takes its share of the rooms (those whose stable choice it is now) from the running persisters,
and a persister removed releases every room it holds; every write succeeds meanwhile, every
reader sees every event, and the workers stop counting the removed writer once it stopped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
import asyncpg

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster import LocalCluster, WorkerSpec
from workers.harness.cluster_client import ClusterClient
from workers.routing import writer_for_room

WRITERS = ["persister1", "persister2"]
GROWN = [*WRITERS, "persister3"]


async def _last_writers(conn: asyncpg.Connection, rooms: list[str]) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT DISTINCT ON (room_id) room_id, instance_name FROM events WHERE room_id = ANY($1::text[])"
        " ORDER BY room_id, stream_ordering DESC",
        rooms,
    )
    return {r["room_id"]: r["instance_name"] for r in rows}


async def _until(check: Callable[[], Awaitable[bool] | bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        done = check()
        if done if isinstance(done, bool) else await done:
            return
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def _logged(cluster: LocalCluster, name: str, text: str) -> bool:
    return text in cluster.log_path(name).read_text(errors="replace")


async def test_a_persister_added_then_removed_by_config_reload(
    make_cluster: MakeCluster, database_url: str
) -> None:
    stored = dict.fromkeys(("account_data", "device_lists", "to_device", "receipts"), WRITERS)
    cluster = await make_cluster(persisters=2, sync_workers=1, background_workers=0, stream_writers=stored)
    conn = await asyncpg.connect(database_url)
    async with aiohttp.ClientSession() as session:
        alice = ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        rooms: list[str] = []
        while sum(writer_for_room(r, GROWN) == "persister3" for r in rooms) < 3 or len(rooms) < 8:
            rooms.append(await alice.create_room("public", via="sync1"))
        moving = [r for r in rooms if writer_for_room(r, GROWN) == "persister3"]
        sent: dict[str, list[str]] = {room: [] for room in rooms}

        async def send_all(label: str) -> None:
            for room in rooms:
                await alice.send(room, "m.room.message", {"body": f"{label} {room}"}, via="sync1")
                sent[room].append(f"{label} {room}")

        await send_all("before")

        # Add: every running worker learns persister3, then it starts and takes its share.
        cluster.workers["persister3"] = WorkerSpec("persister3", writes_events=True)
        await cluster.reload()
        await cluster.start(["persister3"])

        async def moved() -> bool:
            await send_all("added")
            last = await _last_writers(conn, moving)
            return all(last[room] == "persister3" for room in moving)

        await _until(moved, "the rooms whose stable choice is persister3 moved there")
        held = await conn.fetch(
            "SELECT room_id FROM room_leases WHERE writer = 'persister3' AND NOT released"
        )
        assert set(moving) <= {r["room_id"] for r in held}
        assert _logged(cluster, "persister1", "rooms handed on") or _logged(
            cluster, "persister2", "rooms handed on"
        )

        # Remove: every worker reloads without it; it finishes, releases its rooms, then stops.
        cluster.workers["persister3"].writes_events = False
        await cluster.reload()
        await _until(
            lambda: _logged(cluster, "persister3", "is no longer a writer of events"),
            "persister3 stepped down",
        )
        left = await conn.fetchval(
            "SELECT count(*) FROM room_leases WHERE writer = 'persister3' AND NOT released"
        )
        assert left == 0
        await send_all("removed")
        assert await cluster.stop(names=["persister3"]) == {"persister3": 0}
        del cluster.workers["persister3"]
        await send_all("stopped")
        last = await _last_writers(conn, rooms)
        assert set(last.values()) <= set(WRITERS), last

        # Every worker stops counting persister3 once it stopped: the events position moves on.
        for name in ("sync1", *WRITERS):
            await _until(
                lambda name=name: _logged(cluster, name, "writer persister3 retired"),
                f"{name} retired persister3",
            )
        top = await conn.fetchval("SELECT max(stream_ordering) FROM events")

        async def caught_up() -> bool:
            health = await cluster.health("sync1")
            return bool(health["persisted_upto"]["events"] >= top)

        await _until(caught_up, "sync1's events position passed every event")

        for room in rooms:  # the reader saw every event, in order
            page = await alice.messages(room, via="sync1", dir="b", limit=50)
            bodies = [e["content"]["body"] for e in reversed(page["chunk"]) if e["type"] == "m.room.message"]
            assert bodies == sent[room], room
    await conn.close()
