"""workers.storage.events: a redaction recorded with its own write prunes its target on every read."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from tests.conftest import Servers
from workers.handlers.rooms.versions import RoomVersion, render
from workers.handlers.sync.recent_events import EventBodies
from workers.model import REDACTION_EVENT, Event, NewEvent
from workers.storage import events as store
from workers.storage.migrate import apply_migrations, available_migrations

ROOM, OTHER = "!room:hs", "!other:hs"


def _event(ordering: int, event: NewEvent) -> Event:
    return event.persisted(ordering, "w1", 1000 + ordering)


async def _write(pool: asyncpg.Pool, *events: Event) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await store.insert_batch(conn, events, [e.to_json() for e in events], [], "w1")


def _redaction(event_id: str, room: str, target: str, **extra: str) -> NewEvent:
    return NewEvent(event_id, room, REDACTION_EVENT, "@mod:hs", {"redacts": target, **extra})


async def test_reads_prune_by_the_rooms_version_and_name_the_redaction(db_pool: asyncpg.Pool) -> None:
    create = _event(1, NewEvent("$create", ROOM, "m.room.create", "@a:hs", {"room_version": "10"}, ""))
    topic = _event(2, NewEvent("$topic", ROOM, "m.room.topic", "@a:hs", {"topic": "secret"}, ""))
    power = _event(3, NewEvent("$power", ROOM, "m.room.power_levels", "@a:hs",
                               {"users": {"@a:hs": 100}, "invite": 0, "notifications": {}}, ""))  # fmt: skip
    message = _event(4, NewEvent("$msg", ROOM, "m.room.message", "@a:hs", {"body": "oops"}))
    await _write(db_pool, create, topic, power, message)
    # A redaction and its record are one write: a batch with one needs a transaction.
    assert not store.needs_transaction([message], [])
    assert store.needs_transaction([message, _event(5, _redaction("$r", ROOM, "$msg"))], [])
    redactions = [
        _event(5, _redaction("$r1", ROOM, "$msg", reason="spam")),
        _event(6, _redaction("$r2", ROOM, "$topic")),
        _event(7, _redaction("$r3", ROOM, "$power")),
        _event(8, _redaction("$again", ROOM, "$msg")),  # a second redaction: the first stays
    ]
    await _write(db_pool, *redactions)
    await _write(db_pool, _event(9, _redaction("$r4", ROOM, "$r1")))  # the redaction, redacted
    async with db_pool.acquire() as conn:
        by_id = await store.events_by_ids(conn, ["$msg", "$topic", "$power", "$create", "$r1"])
        in_room = await store.room_events(conn, ROOM, limit=20)
        newest_first = await store.room_events(conn, ROOM, descending=True, limit=20)
        state = await store.state_at(conn, ROOM, 100)
        at = await store.events_at(conn, [2, 4])
        windowed = await store.events_for_rooms(conn, [ROOM], {}, (0, 100), 20)
        as_stored = await store.events_by_writer(conn, "w1", 0, 100, 20)
        recorded = dict(await conn.fetch("SELECT redacts, redaction_id FROM redactions"))
        ids = ["$msg", "$topic", "$power", "$create", "$r1", "$never"]
        with_counts, counts = await store.events_with_key_counts(conn, ids, [("@a:hs", "D")])
    assert with_counts == by_id  # the same events, pruned alike, whatever rides with them
    assert counts == {("@a:hs", "D"): ({"signed_curve25519": 0}, [])}
    assert recorded == {"$msg": "$r1", "$topic": "$r2", "$power": "$r3", "$r1": "$r4"}
    msg = by_id["$msg"]
    assert msg.content == {}
    because = msg.redacted_because
    assert because is not None and because.event_id == "$r1" and because.stream_ordering == 5
    # The redaction was redacted in turn: what names it is pruned too (v10 keeps nothing of it).
    assert because.content == {} and by_id["$r1"].content == {}
    assert by_id["$topic"].content == {}
    assert by_id["$power"].content == {"users": {"@a:hs": 100}}  # v10 drops invite, notifications
    assert by_id["$create"] == create
    assert [e.stream_ordering for e in in_room] == list(range(1, 10))
    assert [e.stream_ordering for e in newest_first] == list(range(9, 0, -1))
    assert [e.stream_ordering for e in windowed] == list(range(1, 10))
    for events in (in_room, newest_first, windowed, state, list(at.values())):
        for event in events:
            assert event == by_id.get(event.event_id, event)
    assert [(e.type, e.content) for e in state] == [
        ("m.room.create", {"room_version": "10"}), ("m.room.power_levels", {"users": {"@a:hs": 100}}),
        ("m.room.topic", {}),
    ]  # fmt: skip
    assert at[4] == msg and at[2].content == {}
    # Stream rows are built from the stored events, as written.
    assert {e.event_id: e.content for e in as_stored}["$msg"] == {"body": "oops"}
    # Rendered: unsigned.redacted_because is the redaction in the client format of the room version.
    body = render(msg, RoomVersion("10"))
    assert body["content"] == {} and body["unsigned"]["redacted_because"]["event_id"] == "$r1"
    assert body["unsigned"]["redacted_because"]["room_id"] == ROOM
    unredacted = render(by_id["$create"], RoomVersion("10"))
    assert unredacted["unsigned"] == {}


async def test_a_redaction_applies_only_to_an_event_of_its_own_room(db_pool: asyncpg.Pool) -> None:
    await _write(
        db_pool,
        _event(1, NewEvent("$create", ROOM, "m.room.create", "@a:hs", {"room_version": "11"}, "")),
        _event(2, NewEvent("$elsewhere", OTHER, "m.room.message", "@a:hs", {"body": "keep"})),
        _event(3, NewEvent("$pl", ROOM, "m.room.power_levels", "@a:hs", {"invite": 50, "kick": 1}, "")),
    )
    # Another room's event, an event not stored, and an id a stream row cannot carry: nothing.
    await _write(
        db_pool,
        _event(4, _redaction("$cross", ROOM, "$elsewhere")),
        _event(5, _redaction("$nothing", ROOM, "$never")),
        _event(6, NewEvent("$odd", ROOM, REDACTION_EVENT, "@a:hs", {"redacts": "$not an id"})),
        _event(7, _redaction("$create-gone", ROOM, "$create", reason="why")),
        _event(8, _redaction("$pl-gone", ROOM, "$pl")),
    )
    async with db_pool.acquire() as conn:
        found = await store.events_by_ids(conn, ["$elsewhere", "$create", "$pl", "$create-gone"])
        count = await conn.fetchval("SELECT count(*) FROM redactions")
    assert count == 2
    assert found["$elsewhere"].content == {"body": "keep"} and found["$elsewhere"].redacted_because is None
    # Version 11: the create event keeps all its content, power levels keep `invite`.
    assert found["$create"].content == {"room_version": "11"}
    assert found["$pl"].content == {"invite": 50, "kick": 1}
    because = found["$create"].redacted_because
    assert because is not None and because.content == {"redacts": "$create", "reason": "why"}
    body = render(found["$create"], RoomVersion("11"), room_id=False)
    assert body["unsigned"]["redacted_because"] == {
        "type": REDACTION_EVENT, "content": {"redacts": "$create", "reason": "why"},
        "event_id": "$create-gone", "sender": "@mod:hs", "origin_server_ts": 1007, "unsigned": {},
        "redacts": "$create",
    }  # fmt: skip


async def test_event_bodies_forget_a_redacted_body_even_while_reading_it(db_pool: asyncpg.Pool) -> None:
    message = _event(1, NewEvent("$msg", ROOM, "m.room.message", "@a:hs", {"body": "oops"}))
    await _write(db_pool, message)
    bodies = EventBodies(db_pool)
    assert (await bodies.get(["$msg"]))["$msg"].content == {"body": "oops"}
    await _write(db_pool, _event(2, _redaction("$r", ROOM, "$msg")))
    assert (await bodies.get(["$msg"]))["$msg"].content == {"body": "oops"}  # cached: stale
    bodies.forget(["$msg", "$unknown"])
    reads = bodies.reads
    assert (await bodies.get(["$msg"]))["$msg"].content == {}
    assert bodies.reads == reads + 1
    # A read in flight when its id is forgotten keeps nothing: the next request reads again.
    other = EventBodies(db_pool)
    async with db_pool.acquire() as conn, conn.transaction():
        await conn.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        in_flight = asyncio.ensure_future(other.get(["$msg"]))
        await asyncio.sleep(0.1)
        other.forget(["$msg"])
    assert "$msg" in await in_flight
    reads = other.reads
    await other.get(["$msg"])
    assert other.reads == reads + 1


async def test_the_migration_applies_the_redactions_stored_before_it(servers: Servers) -> None:
    """A database of the previous schema holding redactions: migrating records the earliest
    redaction of each event of the redaction's own room, and reads prune it."""
    name = f"m_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(servers.admin_url)
    await admin.execute(f"CREATE DATABASE {name}")
    await admin.close()
    conn = await asyncpg.connect(servers.database_url(name))
    try:
        shipped = available_migrations()
        redactions = next(m.version for m in shipped if m.name == "redactions")
        await apply_migrations(conn, migrations=[m for m in shipped if m.version < redactions])
        events = [
            _event(1, NewEvent("$create", ROOM, "m.room.create", "@a:hs", {"room_version": "11"}, "")),
            _event(2, NewEvent("$msg", ROOM, "m.room.message", "@a:hs", {"body": "oops"})),
            _event(3, NewEvent("$far", OTHER, "m.room.message", "@a:hs", {"body": "far"})),
            _event(4, _redaction("$first", ROOM, "$msg")),
            _event(5, _redaction("$second", ROOM, "$msg")),
            _event(6, _redaction("$cross", ROOM, "$far")),
            _event(7, _redaction("$create-gone", ROOM, "$create")),
        ]
        await store.copy_event_rows(
            conn,
            [(e.stream_ordering, e.instance_name, e.event_id, e.room_id, e.type, e.state_key, e.sender,
              e.to_json(), e.received_ts) for e in events],
        )  # fmt: skip
        await conn.execute("INSERT INTO rooms (room_id, room_version, creator) VALUES ($1, '11', '@a')", ROOM)
        await apply_migrations(conn)
        recorded = {tuple(r) for r in await conn.fetch("SELECT * FROM redactions")}
        found = await store.events_by_ids(conn, ["$msg", "$far", "$create"])
    finally:
        await conn.close()
        await servers.drop_database(name)
    assert recorded == {("$msg", "$first", "11"), ("$create", "$create-gone", "11")}
    assert found["$msg"].content == {} and found["$far"].content == {"body": "far"}
    assert found["$create"].content == {"room_version": "11"}
