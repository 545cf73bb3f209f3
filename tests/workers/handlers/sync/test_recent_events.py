"""workers.handlers.sync.recent_events: the in-memory window answers exactly what the database would,
or says it cannot; concurrent syncs read a body once."""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import asyncpg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.pubsub.conftest import wait_for
from tests.workers.conftest import MakeWorker, client_for
from workers.app import Worker
from workers.handlers.stored.one_time_keys import CountReads
from workers.handlers.sync import recent_events
from workers.handlers.sync.recent_events import EventBodies, EventRef, RecentEvents, StoredWitness
from workers.harness.cluster_client import timeline_events
from workers.model import NewEvent
from workers.storage.events import insert_batch
from workers.streams.events import EVENTS

WRITERS = ("w1", "w2", "w3")
ROOMS = ("!a", "!b", "!c", "!d")


def _ref(ordering: int) -> EventRef:
    rnd = random.Random(ordering)
    room = rnd.choice(ROOMS)
    return EventRef(ordering, rnd.choice(WRITERS), f"$e{ordering}", room, "m.room.message", None, "@s:hs")


def _expected(
    refs: list[EventRef],
    rooms: set[str],
    windows: dict[str, tuple[int, int]],
    default: tuple[int, int],
    limit: int,
) -> list[EventRef]:
    """`events_for_rooms` spelled out: in the rooms, inside the writer's window, first `limit`."""
    found = [
        r
        for r in sorted(refs)
        if r.room_id in rooms and windows.get(r.instance_name, default)[0] < r.stream_ordering
        if r.stream_ordering <= windows.get(r.instance_name, default)[1]
    ]
    return found[:limit]


@settings(max_examples=300, deadline=None)
@given(
    floor=st.integers(0, 20),
    orderings=st.lists(st.integers(1, 120), unique=True, max_size=80),
    max_events=st.integers(4, 40),
    rooms=st.sets(st.sampled_from(ROOMS), min_size=1),
    bounds=st.lists(st.tuples(st.integers(0, 120), st.integers(0, 120)), min_size=4, max_size=4),
    limit=st.integers(1, 30),
    forget_at=st.one_of(st.none(), st.integers(0, 79)),
)
def test_a_window_is_exactly_the_databases_or_unknown(
    floor: int,
    orderings: list[int],
    max_events: int,
    rooms: set[str],
    bounds: list[tuple[int, int]],
    limit: int,
    forget_at: int | None,
) -> None:
    """Rows arrive in any order (several writers); old ones are dropped and `forget` raises the
    floor. Whenever the index answers, its answer is what the database holds above the floor."""
    index = RecentEvents(floor, max_events=max_events)
    applied = [_ref(o) for o in orderings]
    for i, ref in enumerate(applied):
        index.add([ref])
        if i == forget_at:
            index.forget(ref.stream_ordering)
    windows = {w: (min(lo, hi), max(lo, hi)) for w, (lo, hi) in zip(WRITERS, bounds, strict=False)}
    default = (min(bounds[3]), max(bounds[3]))
    answer = index.window(rooms, windows, default, limit)
    lows = [lo for lo, hi in (*windows.values(), default) if lo < hi]
    if answer is None:
        assert lows and min(lows) < index.floor
        return
    stored = [r for r in applied if r.stream_ordering > floor]
    assert answer == _expected(stored, rooms, windows, default, limit)


def test_below_the_floor_and_while_blind_it_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a writer it does not follow writes, the index has none of its events: no answer until
    the blind period is over and the floor has moved above every ID allocated by then."""
    monkeypatch.setattr(recent_events, "BLIND_S", 0.05)
    index = RecentEvents(10)
    index.add([_ref(11), _ref(12)])
    room = _ref(12).room_id
    assert index.window({room}, {}, (10, 12), 5) == [r for r in (_ref(11), _ref(12)) if r.room_id == room]
    assert index.window({room}, {}, (9, 12), 5) is None
    index.blind()
    assert index.window({room}, {}, (11, 12), 5) is None
    index.reopen(40)  # too early: still blind
    assert index.window({room}, {}, (11, 12), 5) is None and not index.blind_over()
    time.sleep(0.06)
    assert index.blind_over() and index.window({room}, {}, (11, 12), 5) is None
    index.reopen(40)
    assert index.floor == 40 and index.window({room}, {}, (12, 50), 5) is None
    assert index.window({room}, {}, (40, 50), 5) == []
    assert (index.hits, index.misses, index.invalidations) == (2, 5, 1)  # reopen forgot everything


async def test_concurrent_syncs_read_each_body_once(db_pool: asyncpg.Pool) -> None:
    event = NewEvent("$one", "!room", "m.room.message", "@u:t", {"body": "hi"}).persisted(1, "w1", 0)
    async with db_pool.acquire() as conn:
        await insert_batch(conn, [event], [event.to_json()], [], "w1")
    bodies = EventBodies(db_pool)
    answers = await asyncio.gather(*(bodies.get(["$one", "$missing"]) for _ in range(200)))
    assert all(a == {"$one": event} for a in answers)
    assert bodies.reads <= 2  # one read; "$missing" again by whoever waited for it
    assert await bodies.get(["$one"]) == {"$one": event} and bodies.reads <= 2
    assert bodies.misses == 400 and bodies.hits == 1 and len(bodies) == 1  # waiting for a read: a miss


async def _parked(
    reader: Worker, room: str, poll: Callable[[str], Coroutine[Any, Any, dict[str, Any]]], since: str
) -> asyncio.Task[dict[str, Any]]:
    """A long-poll parked on `room`: one answered before it parked (something the first sync had
    not seen yet arrived meanwhile) is polled again from its own token."""
    task = asyncio.create_task(poll(since))
    while not await _parks(reader, room, task):
        task = asyncio.create_task(poll((await task)["next_batch"]))
    return task


async def _parks(reader: Worker, room: str, task: asyncio.Task[dict[str, Any]]) -> bool:
    await wait_for(lambda: reader.notifier.watching(room) or task.done(), what="a poll parked")
    return reader.notifier.watching(room)


async def test_a_line_for_a_watched_room_is_proven_by_its_body_read_before_the_wake(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """`StoredWitness` on a sync worker: with a long-poll parked on the room, the event's body is
    read as its line arrives and proves its token (no sequence read), so the woken answer reads no
    body of its own; with no poll parked, the sequence decides and nothing is read ahead."""
    writer = await make_worker("p1", ["p1"], serve_reads=False)
    reader = await make_worker("s1", ["p1"])
    alice, bob = client_for(http, [writer, reader], ["p1"]), client_for(http, [writer, reader], ["p1"])
    await alice.register("@witness-alice")
    await bob.register("@witness-bob")
    room = await alice.create_room("public", via="p1")
    await bob.membership(room, "join", via="p1")
    # A token from after the join reached s1: else the parked poll may wake for the join's line.
    joined = writer.generators[EVENTS].get_current_token_for_writer("p1")
    await wait_for(
        lambda: reader.generators[EVENTS].get_current_token_for_writer("p1") >= joined, what="the join on s1"
    )
    since = (await bob.sync("s1"))["next_batch"]
    witnessed = reader.replication.metrics.value
    before = witnessed("fanout_repl_witnessed_total")
    poll = await _parked(reader, room, lambda token: bob.sync("s1", token, 10_000), since)
    reads = reader.sync.bodies.reads
    counts = reader.stored.one_time_keys._reads
    statements, rode, taken = counts.statements, counts.rode, counts.taken_ahead
    sent = await alice.send(room, "m.room.message", {"body": "seen"}, via="p1")
    answer = await poll
    assert sent["event_id"] in [e["event_id"] for e in timeline_events(answer)]
    assert witnessed("fanout_repl_witnessed_total") == before + 1
    assert reader.sync.bodies.reads == reads + 1  # the line's read: the answer found the body here
    # The key counts were read in the body's statement, for the answer, and taken by it.
    assert answer["device_one_time_keys_count"] == {"signed_curve25519": 0}
    assert (counts.statements, counts.rode, counts.taken_ahead) == (statements, rode + 1, taken + 1)

    await alice.send(room, "m.room.message", {"body": "unwatched"}, via="p1")
    await asyncio.sleep(0.3)
    assert witnessed("fanout_repl_witnessed_total") == before + 1


async def test_a_witness_never_awaited_takes_no_count_reads(db_pool: asyncpg.Pool) -> None:
    """A line cancelled before its witness ran leaves the turn's key-count reads to their own
    statement: an answer waiting on one is never stranded."""
    counts = CountReads(db_pool)
    waiting = counts.read("@bob:localhost", "PHONE")
    witness = StoredWitness(
        EventBodies(db_pool), lambda room: True, lambda rooms: counts.ride([("@bob:localhost", "PHONE")])
    )
    row = EventRef(1, "w1", "$e", "!r:hs", "m.room.message", None, "@a:hs")
    found = witness("w1", [(1, row)])
    assert inspect.iscoroutine(found)
    found.close()
    assert (await asyncio.wait_for(waiting, 5)).one_time == {"signed_curve25519": 0}
    assert (counts.statements, counts.rode) == (1, 0)
