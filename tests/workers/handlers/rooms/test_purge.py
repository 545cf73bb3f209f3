"""A room's end on in-process workers: when its last local member leaves, the room's writer writes
a caches-stream row (through the current-membership table) and every worker drops what it keeps
of the room; a purge racing sends leaves no half room."""

from __future__ import annotations

import asyncio

import aiohttp
import asyncpg

from tests.pubsub.conftest import wait_for
from tests.workers.conftest import MakeWorker, client_for
from workers.handlers.rooms.purge import PurgeOptions
from workers.harness.cluster_client import RequestRefused
from workers.model import ROOM_EMPTIED_CACHE
from workers.storage import room_deletions
from workers.storage.purge import all_members
from workers.streams.caches import CACHES


async def _emptied_rows(database_url: str, room_id: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM cache_invalidation_stream_by_instance WHERE cache_func = $1 AND keys = $2",
            ROOM_EMPTIED_CACHE,
            [room_id],
        )
        return int(count)
    finally:
        await conn.close()


async def test_last_local_member_leaving_drops_the_room_on_every_worker(
    make_worker: MakeWorker, http: aiohttp.ClientSession, database_url: str
) -> None:
    writer = await make_worker("p1", ["p1"])
    reader = await make_worker("s1", ["p1"])
    alice, bob = (client_for(http, [writer, reader], ["p1"]) for _ in range(2))
    await alice.register("@alice")
    await bob.register("@bob")
    room = await alice.create_room("public", via="s1")
    await bob.membership(room, "join", via="s1")
    await alice.send(room, "m.room.message", {"body": "hello"}, via="s1")
    await bob.sync("s1")  # loads s1's caches of the room
    assert room in reader.caches.room_visibility and room in reader.caches.current_state
    assert room in writer.room_views.rooms

    await alice.membership(room, "leave", via="s1")
    # The leave's caches-stream row reaches s1 shortly after its event (it invalidates the room's
    # state caches): once applied, load them again, so that what drops them below is the room's end.
    own, seen = writer.generators[CACHES], reader.generators[CACHES]
    await wait_for(lambda: seen.get_current_token_for_writer("p1") >= own.get_current_token_for_writer("p1"))
    await reader.caches.room_visibility.get(room)
    await reader.caches.current_state.get(room)
    assert await _emptied_rows(database_url, room) == 0  # bob is still in it
    assert room in reader.caches.room_visibility

    await bob.membership(room, "leave", via="s1")
    assert await _emptied_rows(database_url, room) == 1
    assert room not in writer.room_views.rooms  # dropped before the leave was answered
    for _ in range(100):  # s1 applies the row within one replication delay
        if room not in reader.caches.room_visibility:
            break
        await asyncio.sleep(0.05)
    assert room not in reader.caches.room_visibility and room not in reader.caches.current_state
    assert writer.room_writes.end is not None and writer.room_writes.end.cleanups == 1

    # The room itself stays: public, it can be joined again, and its history is still there.
    await bob.membership(room, "join", via="s1")
    page = await bob.messages(room, via="s1", dir="b", limit=50)
    assert "hello" in [e["content"].get("body") for e in page["chunk"]]


async def test_a_purge_racing_sends_leaves_no_half_room(
    make_worker: MakeWorker, http: aiohttp.ClientSession, database_url: str
) -> None:
    writer = await make_worker("p1", ["p1"])
    alice = client_for(http, [writer], ["p1"])
    await alice.register("@alice")
    room = await alice.create_room("public")
    sends = [
        asyncio.create_task(alice.send(room, "m.room.message", {"body": str(i)}, via="p1")) for i in range(60)
    ]
    await asyncio.wait(sends, return_when=asyncio.FIRST_COMPLETED)  # the others are on their way
    options = PurgeOptions(block=True, purge=True, requested_by="@root:localhost")
    result = await writer.room_writes.purge(room, options)
    assert result.kicked_users == ["@alice:localhost"]
    outcomes = await asyncio.gather(*sends, return_exceptions=True)
    sent = [o for o in outcomes if isinstance(o, dict)]
    refused = [o for o in outcomes if isinstance(o, RequestRefused)]
    assert sent and len(sent) + len(refused) == len(outcomes), outcomes
    assert all(o.status in (403, 404) for o in refused), refused
    conn = await asyncpg.connect(database_url)
    try:
        left = await conn.fetch("SELECT type, state_key FROM events WHERE room_id = $1", room)
        state = await conn.fetchval("SELECT count(*) FROM current_state_events WHERE room_id = $1", room)
        assert await all_members(conn, room) == ["@alice:localhost"]
    finally:
        await conn.close()
    # Only alice's leave is left of the room: no send that was admitted landed after the purge.
    assert [(r["type"], r["state_key"]) for r in left] == [("m.room.member", "@alice:localhost")]
    assert state == 0


async def test_a_deletion_its_writer_left_unfinished_fails_when_the_writer_starts(
    make_worker: MakeWorker, database_url: str
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        mine = await room_deletions.start(conn, "!gone:localhost", "p1")  # as p1 records it, then dies
        others = await room_deletions.start(conn, "!other:localhost", "p2")
    finally:
        await conn.close()
    await make_worker("p1", ["p1", "p2"])
    conn = await asyncpg.connect(database_url)
    try:
        failed, running = await room_deletions.by_id(conn, mine), await room_deletions.by_id(conn, others)
    finally:
        await conn.close()
    assert failed is not None and failed.status == "failed" and "interrupted" in str(failed.error)
    assert running is not None and running.status == "shutting_down"  # p2's own, p2 is not back
