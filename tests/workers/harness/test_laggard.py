"""Laggards and limited timelines on a real worker: a reader whose answer says `limited: true`
fills the gap with /messages back to its since, and the history check reads the fill; a
laggard's pause follows the run's expected length."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import aiohttp

from tests.workers.conftest import MakeWorker
from workers.harness.cluster_client import ClusterClient
from workers.harness.history import StoredEvent, check_history
from workers.harness.laggard import LONGEST_S, SHORTEST_S, TIMELINE_LIMIT, LagClock, LaggardReader
from workers.storage import connect


def test_the_lag_follows_the_runs_expected_length() -> None:
    rng = random.Random(1)
    short = LagClock(lambda: 70.0, rng)
    assert all(8.0 <= short.next_pause() <= 12.0 for _ in range(50))  # ~6 lags in a 70 s run
    assert LagClock(lambda: 3600.0, rng).next_pause() == LONGEST_S
    assert LagClock(lambda: 2.0, rng).next_pause() == SHORTEST_S
    assert SHORTEST_S <= LagClock(lambda: None, rng).next_pause() <= LONGEST_S


async def test_a_laggard_fills_the_gap_of_a_limited_timeline(
    make_worker: MakeWorker, database_url: str
) -> None:
    """Bob joins a shared room inside his window: the timeline says limited (history before the
    window may be read); the laggard pages /messages back to its since and the check passes."""
    worker = await make_worker("w", ["w"])
    url = {"w": f"http://127.0.0.1:{worker.http_port}"}
    async with aiohttp.ClientSession() as session:
        alice, bob = ClusterClient(session, url, ["w"]), ClusterClient(session, url, ["w"])
        await alice.register("lag-alice")
        await bob.register("lag-bob")
        room = await alice.create_room("public")
        for n in range(4):
            await alice.send(room, "m.room.message", {"body": f"before {n}"})
        reader = LaggardReader(bob, ["w"], 1, LagClock(lambda: 1.0, random.Random(1)))
        await reader.initial()
        await bob.membership(room, "join")
        for n in range(2 * TIMELINE_LIMIT):
            await alice.send(room, "m.room.message", {"body": f"after {n}"})
        stop = asyncio.Event()
        stop.set()
        await reader.run(stop, lambda token: len(reader.records) >= 4, 0)
    first = reader.records[0]
    assert first.limited == ((room, True),) and first.filled == ((room, ()),), first
    assert reader.gap_failures == []
    async with connect(database_url) as conn:
        rows = await conn.fetch(
            "SELECT stream_ordering, instance_name, event_id, room_id, type, state_key,"
            " json::jsonb->'content'->>'membership' AS membership,"
            " json::jsonb->'content'->>'history_visibility' AS visibility FROM events WHERE room_id = $1",
            room,
        )
    stored = [StoredEvent(**dict(r)) for r in rows]
    ids = {name: int(i) for name, i in await _instance_ids(database_url)}
    assert check_history(str(bob.user_id), reader.records, stored, ids) == []
    delivered = [i for r in reader.records for i in r.delivered()]
    assert len(delivered) == 1 + 2 * TIMELINE_LIMIT  # his join and every message after it, once
    unfilled = [dataclasses.replace(r, filled=()) for r in reader.records]
    assert any("gap never filled" in p for p in check_history(str(bob.user_id), unfilled, stored, ids))


async def _instance_ids(database_url: str) -> list[tuple[str, int]]:
    async with connect(database_url) as conn:
        return [
            (r["instance_name"], r["instance_id"]) for r in await conn.fetch("SELECT * FROM instance_map")
        ]
