"""The room statistics task on a real database: each room's messages, state changes and joined
members counted once per event, page by page, and resumed where it stopped."""

from __future__ import annotations

import aiohttp
import asyncpg

from tests.pubsub.conftest import wait_for
from tests.workers.conftest import MakeWorker, client_for
from workers.handlers.rooms.stats import TASK_NAME, RoomStatsTask


async def _stats(database_url: str) -> dict[str, tuple[int, int, int]]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT room_id, messages, state_changes, joined_members FROM room_stats")
        return {r["room_id"]: (r["messages"], r["state_changes"], r["joined_members"]) for r in rows}
    finally:
        await conn.close()


async def test_pages_count_each_event_once_and_a_restart_resumes(
    make_worker: MakeWorker, http: aiohttp.ClientSession, database_url: str
) -> None:
    writer = await make_worker("p1", ["p1"])
    alice, bob = (client_for(http, [writer], ["p1"]) for _ in range(2))
    await alice.register("@stats-alice")
    await bob.register("@stats-bob")
    room = await alice.create_room("public")
    other = await alice.create_room("public")
    await bob.membership(room, "join")
    for n in range(5):
        await alice.send(room, "m.room.message", {"body": f"m{n}"})
    await alice.send(other, "m.room.message", {"body": "elsewhere"})
    events = writer.generators["events"]
    async with writer.pool.acquire() as conn:
        top = await conn.fetchval("SELECT max(stream_ordering) FROM events")
        state = {
            r["room_id"]: r["n"]
            for r in await conn.fetch(
                "SELECT room_id, count(*) AS n FROM events WHERE state_key IS NOT NULL GROUP BY room_id"
            )
        }
    await wait_for(lambda: events.get_current_token() >= top)

    task = RoomStatsTask(writer.pool, events, writer.notifier, page=3)
    await task.load()
    assert task.position == 0
    steps = 1
    while await task.step():  # a page of three events at a time
        steps += 1
    assert steps >= top // 3
    assert task.position == events.get_current_token() and task.processed == top
    assert await _stats(database_url) == {room: (5, state[room], 2), other: (1, state[other], 1)}

    await alice.send(room, "m.room.message", {"body": "after"})
    await wait_for(lambda: events.get_current_token() > top)
    again = RoomStatsTask(writer.pool, events, writer.notifier)  # a restart: from the stored progress
    await again.load()
    assert again.position == task.position
    assert not await again.step() and again.processed == 1
    assert (await _stats(database_url))[room] == (6, state[room], 2)
    async with writer.pool.acquire() as conn:
        stored = await conn.fetchval(
            "SELECT position FROM background_progress WHERE task_name = $1", TASK_NAME
        )
    assert stored == again.position
