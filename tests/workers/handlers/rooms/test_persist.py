"""Batches in flight at once: they may commit out of order, but positions and RDATA stay in order."""

from __future__ import annotations

import asyncio

import pytest

from tests.pubsub.conftest import wait_for
from tests.workers.conftest import MakeWorker
from workers.app import Worker
from workers.handlers.placement.room_leases import NotRoomOwner, RoomLeaseLost
from workers.handlers.rooms.persist import EventPersister
from workers.handlers.rooms.rules import new_event_id
from workers.model import NewEvent
from workers.storage import connect
from workers.streams.events import EVENTS


async def test_a_later_batch_that_commits_first_is_not_announced_past_the_held_one(
    make_worker: MakeWorker, database_url: str
) -> None:
    p1 = await make_worker("p1", ["p1"], persist_batches_in_flight=2)
    r1 = await make_worker("r1", ["p1"])
    assert p1.persister is not None and p1.room_leases is not None
    await p1.room_leases.hold("!room")  # what RoomWrites does before it persists
    own, seen = p1.generators[EVENTS], r1.generators[EVENTS]
    async with connect(database_url) as blocker:
        # An uncommitted row with the same event_id holds the first batch's insert on the unique index.
        held = blocker.transaction()
        await held.start()
        await blocker.execute(
            "INSERT INTO events VALUES (-999999, '$held', 'other', '!r', 't', NULL, '@s', '{}', 0)"
        )
        first = p1.persister.persist(NewEvent("$held", "!room", "m.room.message", "@u", {"n": 1}))
        await wait_for(lambda: p1.persister.batches_in_flight == 1, what="first batch in the database")
        second = await p1.persister.persist(NewEvent(new_event_id(), "!room", "m.room.message", "@u", {}))
        assert not first.done()
        # Finished but behind an unfinished ID: neither this writer nor a reader may pass it.
        assert own.get_current_token_for_writer("p1") < second.stream_ordering
        await asyncio.sleep(3 * p1.config.position_announce_interval_s)
        assert seen.get_current_token_for_writer("p1") < second.stream_ordering
        await held.rollback()
    first_event = await first
    assert first_event.stream_ordering < second.stream_ordering  # IDs in arrival order
    await wait_for(lambda: seen.get_current_token_for_writer("p1") >= second.stream_ordering)
    async with connect(database_url) as conn:
        stored = await conn.fetch(
            "SELECT event_id FROM events WHERE stream_ordering > 0 ORDER BY stream_ordering"
        )
    assert [r["event_id"] for r in stored][-2:] == ["$held", second.event_id]


async def test_a_batch_postgres_refuses_is_persisted_in_halves_failing_only_the_bad_event(
    make_worker: MakeWorker, database_url: str
) -> None:
    """The HTTP edge refuses what PostgreSQL would; should something still get through (here a NUL
    in a state key, put straight on the persister), only its own request fails."""
    p1 = await make_worker("p1", ["p1"])
    assert p1.persister is not None and p1.room_leases is not None
    await p1.room_leases.hold("!room")
    events = [NewEvent(new_event_id(), "!room", "m.room.message", f"@u{i}", {"n": i}) for i in range(7)]
    events.insert(3, NewEvent(new_event_id(), "!room", "m.room.topic", "@bad", {}, "nul\x00key"))
    futures = [p1.persister.persist(e) for e in events]  # one loop turn: one batch
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert isinstance(results[3], Exception)
    assert all(not isinstance(r, Exception) for i, r in enumerate(results) if i != 3), results
    assert p1.persister.isolations >= 1
    async with connect(database_url) as conn:
        stored = await conn.fetch(
            "SELECT sender FROM events WHERE type = 'm.room.message' ORDER BY stream_ordering"
        )
    assert [r["sender"] for r in stored] == [f"@u{i}" for i in range(7)]


async def test_possible_retries_are_answered_from_the_stored_event_without_ids_and_drained_on_stop(
    make_worker: MakeWorker, database_url: str
) -> None:
    p1 = await make_worker("p1", ["p1"])
    persister = p1.persister
    assert persister is not None and p1.room_leases is not None
    await p1.room_leases.hold("!room")
    sent = [NewEvent(new_event_id(), "!room", "m.room.message", "@u", {"n": i}) for i in range(50)]
    stored = await asyncio.gather(*(persister.persist(e, may_exist=True) for e in sent))
    assert persister.retries_answered == 0  # first tries: looked up in their allocation, not found, persisted
    async with connect(database_url) as conn:
        before = await conn.fetchval("SELECT last_value FROM events_stream_seq")
        fresh = [NewEvent(new_event_id(), "!room", "m.room.message", "@u", {"new": i}) for i in range(10)]
        futures = [persister.persist(e, may_exist=True) for e in [*sent, *fresh]]
        await persister.stop()  # takes nothing new, but finishes every request it took
        assert all(f.done() for f in futures)
        assert [f.result() for f in futures[:50]] == stored
        assert await conn.fetchval("SELECT last_value FROM events_stream_seq") == before + 10
    assert persister.retries_answered == 50


async def test_a_batch_of_a_room_this_persister_does_not_hold_does_not_commit(
    make_worker: MakeWorker, database_url: str
) -> None:
    """The room lease check in the batch's transaction: a room never taken here, or taken by
    another persister since, fails the batch (503 unprocessed for the senders) and stores nothing."""
    p1 = await make_worker("p1", ["p1", "p2"])
    assert p1.persister is not None and p1.room_leases is not None
    with pytest.raises(RoomLeaseLost):
        await p1.persister.persist(NewEvent(new_event_id(), "!never", "m.room.message", "@u", {}))
    await p1.room_leases.hold("!taken")
    await p1.persister.persist(NewEvent(new_event_id(), "!taken", "m.room.message", "@u", {"n": 1}))
    async with connect(database_url) as conn:
        await conn.execute("UPDATE room_leases SET writer = 'p2', epoch = epoch + 1 WHERE room_id = '!taken'")
        with pytest.raises(RoomLeaseLost):
            await p1.persister.persist(NewEvent(new_event_id(), "!taken", "m.room.message", "@u", {"n": 2}))
        stored = await conn.fetchval("SELECT count(*) FROM events WHERE room_id IN ('!never', '!taken')")
    assert stored == 1
    assert "!taken" not in p1.room_leases.held  # forgotten: the next write asks again


async def test_writes_racing_to_a_room_handed_on_all_follow_its_new_writer(make_worker: MakeWorker) -> None:
    """A room a reload handed on (`RoomLeases.release`) and its new writer took: several writes
    that arrive at the old writer at once are each answered with the new holder (none fails on
    the bookkeeping of the hand-over)."""
    p1 = await make_worker("p1", ["p1", "p2"])
    p2 = await make_worker("p2", ["p1", "p2"])
    assert p1.room_leases is not None and p2.room_leases is not None
    await p1.room_leases.hold("!moving")
    assert await p1.room_leases.release({"!moving": "p2"}, lambda _room: False, 1.0) == 1
    await p2.room_leases.hold("!moving")
    await wait_for(lambda: p1.room_leases is not None and p1.room_leases.hears("p2"))
    holds = [p1.room_leases.hold("!moving") for _ in range(3)]
    outcomes = await asyncio.gather(*holds, return_exceptions=True)
    assert all(isinstance(o, NotRoomOwner) and o.holder == "p2" for o in outcomes), outcomes


def _small_batches(worker: Worker, max_batch: int = 2) -> EventPersister:
    """A second persister on `worker`'s pool, generators and callbacks, taking `max_batch` events
    a batch, so that a batch finds the next one queued when its IDs arrive (and its statement
    carries that batch's allocation)."""
    persister = EventPersister(
        worker.pool, worker.name, worker.generators[EVENTS], None,
        on_committed=worker.order.committed, on_finished=worker.order.finished,
        room_versions=worker.room_versions, on_uncertain=worker.order.uncertain,
        fence=worker.lease.fence if worker.lease else None, room_leases=worker.room_leases,
        max_batch=max_batch,
    )  # fmt: skip
    persister.start()
    return persister


async def test_a_batch_allocated_in_the_statement_before_it_keeps_the_queue_order(
    make_worker: MakeWorker, database_url: str
) -> None:
    """Each batch's IDs come from the statement of the batch before it: stream orderings follow
    the queue, every event is stored once, and a reader sees them all, in that order."""
    p1 = await make_worker("p1", ["p1"])
    r1 = await make_worker("r1", ["p1"])
    assert p1.room_leases is not None
    await p1.room_leases.hold("!room")
    persister = _small_batches(p1)
    try:
        sent = [NewEvent(new_event_id(), "!room", "m.room.message", "@u", {"n": i}) for i in range(21)]
        stored = await asyncio.gather(
            *(persister.persist(e, may_exist=i % 2 == 0) for i, e in enumerate(sent))
        )
    finally:
        await persister.stop()
    assert persister.rides == 10  # 11 batches of 2, 2, ..., 1: all but the first ride on the one before
    orderings = [e.stream_ordering for e in stored]
    assert orderings == sorted(orderings) and len(set(orderings)) == len(sent)
    assert [e.event_id for e in stored] == [e.event_id for e in sent]
    async with connect(database_url) as conn:
        rows = await conn.fetch(
            "SELECT event_id, stream_ordering FROM events WHERE room_id = '!room' ORDER BY stream_ordering"
        )
    assert [(r["event_id"], r["stream_ordering"]) for r in rows] == [
        (e.event_id, e.stream_ordering) for e in stored
    ]
    await wait_for(
        lambda: r1.generators[EVENTS].get_current_token() >= orderings[-1], what="the reader's position"
    )
    assert p1.generators[EVENTS].get_current_token() >= orderings[-1]  # every ID finished


async def test_a_retry_found_by_a_carried_allocation_takes_no_id(
    make_worker: MakeWorker, database_url: str
) -> None:
    p1 = await make_worker("p1", ["p1"])
    assert p1.room_leases is not None
    await p1.room_leases.hold("!room")
    persister = _small_batches(p1)
    try:
        first = [NewEvent(new_event_id(), "!room", "m.room.message", "@u", {"n": i}) for i in range(2)]
        stored = await asyncio.gather(*(persister.persist(e, may_exist=True) for e in first))
        async with connect(database_url) as conn:
            before = await conn.fetchval("SELECT last_value FROM events_stream_seq")
            fresh = [NewEvent(new_event_id(), "!room", "m.room.message", "@u", {"new": i}) for i in range(3)]
            # The first batch (fresh 0 and 1) carries the allocation of the next: a retry and fresh 2.
            sent = [fresh[0], fresh[1], first[1], fresh[2]]
            results = await asyncio.gather(*(persister.persist(e, may_exist=True) for e in sent))
            assert await conn.fetchval("SELECT last_value FROM events_stream_seq") == before + 3
    finally:
        await persister.stop()
    assert persister.rides >= 1 and persister.retries_answered == 1
    assert results[2] == stored[1]
    assert [r.event_id for r in results] == [e.event_id for e in sent]


async def test_the_next_batch_goes_back_to_the_queue_when_the_statement_carrying_it_fails(
    make_worker: MakeWorker, database_url: str
) -> None:
    """PostgreSQL refuses a batch (a NUL in a sender, put straight on the persister): its
    statement carried the next batch's allocation, which is then taken again; only the bad
    request fails, every other event is stored once."""
    p1 = await make_worker("p1", ["p1"])
    assert p1.room_leases is not None
    await p1.room_leases.hold("!room")
    persister = _small_batches(p1)
    try:
        sent = [NewEvent(new_event_id(), "!room", "m.room.message", f"@u{i}", {"n": i}) for i in range(6)]
        sent[1] = sent[1]._replace(sender="@bad\x00")
        results = await asyncio.gather(*(persister.persist(e) for e in sent), return_exceptions=True)
    finally:
        await persister.stop()
    assert isinstance(results[1], Exception)
    assert all(not isinstance(r, Exception) for i, r in enumerate(results) if i != 1), results
    assert persister.isolations >= 1
    async with connect(database_url) as conn:
        stored = await conn.fetch(
            "SELECT sender FROM events WHERE room_id = '!room' ORDER BY stream_ordering"
        )
    assert sorted(r["sender"] for r in stored) == sorted(f"@u{i}" for i in range(6) if i != 1)
