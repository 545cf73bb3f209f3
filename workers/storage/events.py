"""SQL for events, current state, membership and the caches log.

Writes happen in the persister's one transaction per batch (`insert_batch`); reads serve sync,
the HTTP API, the background task and the streams' catch-up (update) functions. Every multi-row
write is one statement (a binary COPY for events, `unnest` arrays for the upserts), so a batch costs
a fixed number of round trips.

A redaction is recorded in `redactions` by its own write. `events.json` keeps the original, and
every read that builds events for clients (all but `events_by_writer`, which builds stream rows)
joins `redactions` and returns a redacted event pruned by its room's version
(`workers.redaction_rules`) with the redaction in `Event.redacted_because`.

Over 500 lines because every read of events for clients shares the column list, the redactions'
join and the pruning (`_with_redactions`, `_read_event`), which stay private to this module: a
read split out would have to import them, or repeat them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import asyncpg

from idgen import MultiWriterStreamToken
from workers.model import (
    CREATE_EVENT,
    IMPLICIT_ROOM_VERSION,
    MEMBER_EVENT,
    REDACTION_EVENT,
    CacheInvalidation,
    Event,
    UserRooms,
    membership_of,
    redacts_of,
    room_version_of,
)
from workers.redaction_rules import prune_content, rules_for
from workers.storage import Conn
from workers.storage.one_time_keys import KeyCountsOf, fold_key_counts, key_counts_sql

#: The columns of `events` that reads select and `copy_event_rows` writes, in this order.
EVENT_COLUMNS = (
    "stream_ordering", "instance_name", "event_id", "room_id", "type", "state_key", "sender", "json",
    "received_ts",
)  # fmt: skip
_EVENT_COLUMNS = ", ".join(EVENT_COLUMNS)


def _event(record: asyncpg.Record) -> Event:
    """The event of an `events` row as stored (unpruned)."""
    body = json.loads(record["json"])
    return Event(
        stream_ordering=record["stream_ordering"],
        instance_name=record["instance_name"],
        event_id=record["event_id"],
        room_id=record["room_id"],
        type=record["type"],
        sender=record["sender"],
        content=body.get("content", {}),
        state_key=record["state_key"],
        received_ts=record["received_ts"],
    )


def _with_redactions(query: str, order: str = "") -> str:
    """`query` (which selects `EVENT_COLUMNS` of `events`) with what `_read_event` needs to prune
    a redacted event: the room version it is pruned by, the redaction's stored JSON and, when the
    redaction was redacted in turn, its room version. `order` restores the query's order.

    Each is a lookup of at most one row by a unique key, written as a LATERAL subquery with its
    LIMIT so that PostgreSQL never makes it a hash join: every plan reads the keys' indexes, even
    one made while the tables were small and kept as they grew (see `_each_event`)."""
    return (
        "SELECT q.*, r.room_version AS redacted_in, re.json AS redaction,"
        f" r2.room_version AS redaction_redacted_in FROM ({query}) q"
        " LEFT JOIN LATERAL (SELECT redaction_id, room_version FROM redactions"
        " WHERE redacts = q.event_id LIMIT 1) r ON true"
        " LEFT JOIN LATERAL (SELECT json FROM events WHERE event_id = r.redaction_id LIMIT 1) re ON true"
        " LEFT JOIN LATERAL (SELECT room_version FROM redactions"
        " WHERE redacts = r.redaction_id LIMIT 1) r2 ON true" + (f" ORDER BY {order}" if order else "")
    )


def _each_event(column: str, kind: str, param: int) -> str:
    """`EVENT_COLUMNS` of the events whose unique `column` (of SQL type `kind`) is one of the array
    parameter `param`'s values, each once.

    Each value is looked up on its own (a LATERAL subquery with its LIMIT, never pulled up into a
    join), so every plan reads the unique index. These statements are prepared and kept by each
    connection: `column = ANY($n)` got a generic plan while the table was small (a new database,
    before its first ANALYZE), a sequential scan, and kept it as the table grew: 5-8 ms a lookup
    at 40,000 events, against 0.5 ms for this form planned the same way (docs/performance.md)."""
    return (
        f"SELECT e.* FROM (SELECT DISTINCT unnest(${param}::{kind}[]) AS v) AS wanted,"
        f" LATERAL (SELECT {_EVENT_COLUMNS} FROM events WHERE {column} = wanted.v LIMIT 1) AS e"
    )


def _read_event(record: asyncpg.Record) -> Event:
    """The event of a row of a `_with_redactions` query, as clients get it: pruned when redacted."""
    event = _event(record)
    version: str | None = record["redacted_in"]
    if version is None:
        return event
    because = None
    if record["redaction"] is not None:
        body = json.loads(record["redaction"])
        content = body.get("content", {})
        if record["redaction_redacted_in"] is not None:
            content = prune_content(REDACTION_EVENT, content, rules_for(record["redaction_redacted_in"]))
        because = Event(
            body["stream_ordering"], body["instance_name"], body["event_id"], body["room_id"],
            body["type"], body["sender"], content, body.get("state_key"), body["origin_server_ts"],
        )  # fmt: skip
    content = prune_content(event.type, event.content, rules_for(version))
    return event._replace(content=content, redacted_because=because)


async def insert_batch(
    conn: Conn,
    events: Sequence[Event],
    stored_json: Sequence[str],
    invalidations: Sequence[tuple[int, CacheInvalidation]],
    instance_name: str,
) -> None:
    """Insert `events` (in stream order) with their stored JSON (`Event.json_texts`), fold their
    state into current state and membership, record new rooms with their version and the
    redactions that apply (`_record_redactions`), and log the cache invalidations. Call inside a
    transaction unless `needs_transaction` says one statement suffices (a batch of messages only,
    no redaction: one COPY is atomic on its own).

    Several persisters may write the same room: current state and membership keep the row with the
    highest stream ordering, whatever order the transactions commit in.
    """
    if events:
        await copy_event_rows(conn, event_rows(events, stored_json))
    # Within one statement a key may appear once: keep the last (highest ordering) per key.
    # Rows go in key order, so concurrent batches (and persisters) lock them in one order and
    # cannot deadlock on each other.
    state = {(e.room_id, e.type, e.state_key): e for e in events if e.state_key is not None}
    if state:
        rows = [state[key] for key in sorted(state)]
        await conn.execute(
            "INSERT INTO current_state_events (room_id, type, state_key, event_id, membership,"
            " event_stream_ordering) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],"
            " $5::text[], $6::bigint[])"
            " ON CONFLICT (room_id, type, state_key) DO UPDATE SET event_id = EXCLUDED.event_id,"
            " membership = EXCLUDED.membership, event_stream_ordering = EXCLUDED.event_stream_ordering"
            " WHERE current_state_events.event_stream_ordering < EXCLUDED.event_stream_ordering",
            [e.room_id for e in rows],
            [e.type for e in rows],
            [e.state_key for e in rows],
            [e.event_id for e in rows],
            [e.membership for e in rows],
            [e.stream_ordering for e in rows],
        )
    created = [e for e in state.values() if e.type == CREATE_EVENT and e.state_key == ""]
    if created:
        await conn.execute(
            "INSERT INTO rooms (room_id, room_version, creator) SELECT * FROM unnest($1::text[],"
            " $2::text[], $3::text[]) ON CONFLICT (room_id) DO NOTHING",
            [e.room_id for e in created],
            [room_version_of(e.content) for e in created],
            [e.sender for e in created],
        )
    members = sorted(
        (e for e in state.values() if e.type == MEMBER_EVENT and e.membership is not None),
        key=lambda e: (e.state_key, e.room_id),
    )
    if members:
        await conn.execute(
            "INSERT INTO local_current_membership (user_id, room_id, membership, event_id,"
            " event_stream_ordering) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],"
            " $5::bigint[])"
            " ON CONFLICT (user_id, room_id) DO UPDATE SET membership = EXCLUDED.membership,"
            " event_id = EXCLUDED.event_id, event_stream_ordering = EXCLUDED.event_stream_ordering"
            " WHERE local_current_membership.event_stream_ordering < EXCLUDED.event_stream_ordering",
            [e.state_key for e in members],
            [e.room_id for e in members],
            [e.membership for e in members],
            [e.event_id for e in members],
            [e.stream_ordering for e in members],
        )
    await _record_redactions(conn, events)
    await insert_invalidations(conn, invalidations, instance_name)


async def insert_invalidations(
    conn: Conn, invalidations: Sequence[tuple[int, CacheInvalidation]], instance_name: str
) -> None:
    """Log caches-stream rows (stream id, row) of `instance_name`, where catch-up reads them."""
    if not invalidations:
        return
    await conn.execute(
        "INSERT INTO cache_invalidation_stream_by_instance (stream_id, instance_name, cache_func, keys,"
        " invalidation_ts) SELECT s, $2, f,"
        " CASE WHEN k IS NULL THEN NULL ELSE ARRAY(SELECT x FROM jsonb_array_elements_text(k::jsonb)"
        " WITH ORDINALITY AS e(x, n) ORDER BY n) END, t"
        " FROM unnest($1::bigint[], $3::text[], $4::text[], $5::bigint[]) AS u(s, f, k, t)",
        [stream_id for stream_id, _ in invalidations],
        instance_name,
        [row.cache_func for _, row in invalidations],
        [None if row.keys is None else json.dumps(row.keys) for _, row in invalidations],
        [row.invalidation_ts for _, row in invalidations],
    )


async def _record_redactions(conn: Conn, events: Sequence[Event]) -> None:
    """Record the redactions among `events` whose target is stored in the redaction's room (one
    naming another room's event, or none stored, applies to nothing), with the version the
    target is pruned by. An event's first redaction is the one kept."""
    targets: dict[str, Event] = {}
    for event in events:
        redacts = redacts_of(event.type, event.content)
        if redacts is not None and redacts not in targets:
            targets[redacts] = event
    if not targets:
        return
    await conn.execute(
        "INSERT INTO redactions (redacts, redaction_id, room_version)"
        " SELECT u.redacts, u.redaction_id, coalesce(ro.room_version, $4)"
        " FROM unnest($1::text[], $2::text[], $3::text[]) AS u(redacts, redaction_id, room_id)"
        " JOIN events e ON e.event_id = u.redacts AND e.room_id = u.room_id"
        " LEFT JOIN rooms ro ON ro.room_id = u.room_id"
        " ORDER BY u.redacts ON CONFLICT (redacts) DO NOTHING",
        list(targets),
        [e.event_id for e in targets.values()],
        [e.room_id for e in targets.values()],
        IMPLICIT_ROOM_VERSION,
    )


#: Up to this many rows go in one INSERT of per-column arrays, more in one COPY (see `copy_event_rows`).
INSERT_MAX_ROWS = 8
_INSERT_EVENT_ROWS = (
    f"INSERT INTO events ({_EVENT_COLUMNS}) SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[],"
    " $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[])"
)


@dataclass(frozen=True, slots=True)
class Guard:
    """A condition a write's own statement checks (`event_rows_statement`): SQL whose parameters
    are numbered from $10 (the rows take $1 to $9), and their values."""

    condition: str
    args: tuple[object, ...]


async def copy_event_rows(conn: Conn, rows: Sequence[tuple[object, ...]]) -> None:
    """Write `events` rows (tuples in `EVENT_COLUMNS` order). Many rows: one binary COPY, half the
    client CPU per row of `INSERT ... SELECT * FROM unnest($1::events[])`, whose array encoding
    makes four Python-level isinstance calls per element (callgrind). A few rows (a send's usual
    batch): one INSERT of one array per column, one round trip where COPY takes two (its handshake,
    then the data); measured with 4 rows, 93 against 111-168 µs of client CPU and 0.56 against
    0.79-1.66 ms per batch; from about 16 rows COPY costs less."""
    if not rows:
        return
    if len(rows) > INSERT_MAX_ROWS:
        await conn.copy_records_to_table("events", records=rows, columns=EVENT_COLUMNS)
        return
    await conn.execute(_INSERT_EVENT_ROWS, *map(list, zip(*rows, strict=True)))


def event_rows(events: Sequence[Event], stored_json: Sequence[str]) -> list[tuple[object, ...]]:
    """`events` as rows in `EVENT_COLUMNS` order, with their stored JSON."""
    return [
        (e.stream_ordering, e.instance_name, e.event_id, e.room_id, e.type, e.state_key,
         e.sender, text, e.received_ts)
        for e, text in zip(events, stored_json, strict=True)
    ]  # fmt: skip


def event_rows_statement(
    rows: Sequence[tuple[object, ...]], guard: Guard | None = None
) -> tuple[str, tuple[object, ...]]:
    """The one INSERT that writes a few `events` rows (1 to `INSERT_MAX_ROWS`), only if `guard`
    holds within it when given: (SQL, arguments), for a statement that carries more (an ID
    allocation: `idgen.Ride.carry`)."""
    if not rows or len(rows) > INSERT_MAX_ROWS:
        raise ValueError(f"one INSERT writes 1 to {INSERT_MAX_ROWS} event rows, not {len(rows)}")
    columns = tuple(map(list, zip(*rows, strict=True)))
    if guard is None:
        return _INSERT_EVENT_ROWS, columns
    return f"{_INSERT_EVENT_ROWS} WHERE {guard.condition}", (*columns, *guard.args)


def needs_transaction(events: Sequence[Event], invalidations: Sequence[object]) -> bool:
    """Whether `insert_batch` will run more than one statement for this batch."""
    return bool(invalidations) or any(e.state_key is not None or e.type == REDACTION_EVENT for e in events)


async def events_for_rooms(
    conn: Conn,
    rooms: Iterable[str],
    windows: Mapping[str, tuple[int, int]],
    default: tuple[int, int],
    limit: int,
) -> list[Event]:
    """Live events of `rooms` inside their writer's window (low, high], in stream order, the first
    `limit`.

    `windows` maps a writer to its (low, high]; events of any other instance use `default`. Each
    writer's range is scanned on its own (a LATERAL subquery, never a join that a plan made on a
    small table turns into a scan of them all: `_each_event`), so a writer that lags does not widen
    the others' scans.
    """
    names = list(windows)
    query = (
        "SELECT e.* FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS w(name, low, high),"
        f" LATERAL (SELECT {_EVENT_COLUMNS} FROM events WHERE room_id = ANY($1::text[])"
        " AND instance_name = w.name AND stream_ordering > w.low AND stream_ordering <= w.high"
        " ORDER BY stream_ordering LIMIT $7) AS e"
        f" UNION ALL SELECT {_EVENT_COLUMNS} FROM events WHERE room_id = ANY($1::text[])"
        " AND instance_name <> ALL($2::text[]) AND stream_ordering > $5 AND stream_ordering <= $6"
        " ORDER BY stream_ordering LIMIT $7"
    )
    records = await conn.fetch(
        _with_redactions(query, "q.stream_ordering"),
        list(rooms),
        names,
        [windows[n][0] for n in names],
        [windows[n][1] for n in names],
        default[0],
        default[1],
        limit,
    )
    return [_read_event(r) for r in records]


async def events_by_ids(conn: Conn, event_ids: Sequence[str]) -> dict[str, Event]:
    """The stored events among `event_ids`, by id."""
    return {e.event_id: e for e in await _events_where(conn, "event_id", "text", event_ids)}


async def events_with_key_counts(
    conn: Conn, event_ids: Sequence[str], devices: Sequence[tuple[str, str]]
) -> tuple[dict[str, Event], KeyCountsOf]:
    """`events_by_ids` and `one_time_keys.key_counts_of` in one statement: a sync worker reads the
    bodies of a line's events and the key counts of the devices whose polls it wakes at once, and
    one statement is one round trip and one wake-up of this process and of its backend instead of
    two. The counts come as arrays on every row (one row when no event is stored)."""
    records = await conn.fetch(
        f"WITH {key_counts_sql(2)}, counts AS (SELECT array_agg(user_id) AS counted_users,"
        " array_agg(device_id) AS counted_devices, array_agg(algorithm) AS counted_algorithms,"
        " array_agg(n) AS counted_n FROM counted)"
        " SELECT counts.*, e.* FROM counts LEFT JOIN ("
        + _with_redactions(_each_event("event_id", "text", 1))
        + ") e ON true",
        list(event_ids),
        [u for u, _ in devices],
        [d for _, d in devices],
    )
    first = records[0]
    counted = zip(
        first["counted_users"] or (), first["counted_devices"] or (), first["counted_algorithms"] or (),
        first["counted_n"] or (), strict=True,
    )  # fmt: skip
    events = {r["event_id"]: _read_event(r) for r in records if r["event_id"] is not None}
    return events, fold_key_counts(devices, counted)


async def events_at(conn: Conn, orderings: Sequence[int]) -> dict[int, Event]:
    """The events with these stream orderings, by ordering."""
    return {e.stream_ordering: e for e in await _events_where(conn, "stream_ordering", "bigint", orderings)}


async def _events_where(
    conn: Conn, column: str, kind: str, values: Sequence[str] | Sequence[int]
) -> list[Event]:
    """The events whose `column` (of SQL type `kind`) is one of `values`, with their redactions."""
    records = await conn.fetch(
        _with_redactions(_each_event(column, kind, 1)),
        list(values),
    )
    return [_read_event(r) for r in records]


async def room_events(
    conn: Conn,
    room_id: str,
    *,
    after: int | None = None,
    upto: int | None = None,
    reached: MultiWriterStreamToken | None = None,
    descending: bool = False,
    limit: int,
) -> list[Event]:
    """Events of one room, live and backfilled, with after < stream_ordering <= upto, in stream
    order (newest first when `descending`), at most `limit`. With `reached`, an event counts only
    when the token covers it for its writer (the writers the token names at their positions,
    every other one, current or retired, at its `stream`)."""
    clauses: list[str] = ["room_id = $1"]
    args: list[object] = [room_id]
    if after is not None:
        args.append(after)
        clauses.append(f"stream_ordering > ${len(args)}")
    if upto is not None:
        args.append(upto)
        clauses.append(f"stream_ordering <= ${len(args)}")
    if reached is not None:
        positions = reached.instance_map
        args += [list(positions), list(positions.values()), reached.stream]
        n = len(args)
        clauses.append(
            f"stream_ordering <= coalesce((SELECT p FROM unnest(${n - 2}::text[], ${n - 1}::bigint[])"
            f" AS w(name, p) WHERE w.name = instance_name), ${n})"
        )
    args.append(limit)
    order = "DESC" if descending else "ASC"
    records = await conn.fetch(
        _with_redactions(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(clauses)}"
            f" ORDER BY stream_ordering {order} LIMIT ${len(args)}",
            f"q.stream_ordering {order}",
        ),
        *args,
    )
    return [_read_event(r) for r in records]


async def events_by_writer(conn: Conn, instance: str, low: int, high: int, limit: int) -> list[Event]:
    """`instance`'s events with low < stream_ordering <= high, in stream order, at most `limit`,
    as stored (unpruned: they become stream rows, and a redaction's row names its target).

    For the negative (backfill) stream pass the signed bounds with low > high: rows with
    high <= stream_ordering < low, nearest to zero first.
    """
    if low <= high:
        query = (
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE instance_name = $1"
            " AND stream_ordering > $2 AND stream_ordering <= $3 ORDER BY stream_ordering LIMIT $4"
        )
    else:
        query = (
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE instance_name = $1"
            " AND stream_ordering < $2 AND stream_ordering >= $3 ORDER BY stream_ordering DESC LIMIT $4"
        )
    return [_event(r) for r in await conn.fetch(query, instance, low, high, limit)]


async def invalidations_by_writer(
    conn: Conn, instance: str, low: int, high: int, limit: int
) -> list[tuple[int, CacheInvalidation]]:
    """`instance`'s caches-stream rows with low < stream_id <= high, in order, at most `limit`."""
    records = await conn.fetch(
        "SELECT stream_id, cache_func, keys, invalidation_ts FROM cache_invalidation_stream_by_instance"
        " WHERE instance_name = $1 AND stream_id > $2 AND stream_id <= $3 ORDER BY stream_id LIMIT $4",
        instance,
        low,
        high,
        limit,
    )
    return [
        (
            r["stream_id"],
            CacheInvalidation(
                r["cache_func"], None if r["keys"] is None else tuple(r["keys"]), r["invalidation_ts"]
            ),
        )
        for r in records
    ]


async def user_rooms(conn: Conn, user_id: str) -> UserRooms:
    """Every room the user has a membership in (current or past) and the user's membership history.

    One statement, so one snapshot: read as two, a member event committed between them was in the
    history and not in the rooms, and `UserRooms.with_change` keeps such an entry as it is when the
    event's row comes (the history holds it already): the sync worker left the room out of every
    window until the entry was dropped."""
    records = await conn.fetch(
        "SELECT room_id, stream_ordering, json FROM events WHERE type = 'm.room.member' AND state_key = $1"
        " AND stream_ordering > 0"
        " UNION ALL SELECT room_id, NULL, NULL FROM local_current_membership WHERE user_id = $1"
        " ORDER BY 2",
        user_id,
    )
    rooms: set[str] = set()
    history: dict[str, list[tuple[int, str]]] = {}
    for r in records:
        if r["stream_ordering"] is None:
            rooms.add(r["room_id"])
            continue
        value = membership_of(MEMBER_EVENT, json.loads(r["json"]).get("content", {}))
        if value is not None:
            history.setdefault(r["room_id"], []).append((r["stream_ordering"], value))
    return UserRooms(frozenset(rooms), {k: tuple(v) for k, v in history.items()})


async def joined_members(conn: Conn, room_id: str) -> frozenset[str]:
    records = await conn.fetch(
        "SELECT user_id FROM local_current_membership WHERE room_id = $1 AND membership = 'join'", room_id
    )
    return frozenset(r["user_id"] for r in records)


async def joined_rooms(conn: Conn, user_id: str) -> list[str]:
    records = await conn.fetch(
        "SELECT room_id FROM local_current_membership WHERE user_id = $1 AND membership = 'join'"
        " ORDER BY room_id",
        user_id,
    )
    return [r["room_id"] for r in records]


async def membership(conn: Conn, user_id: str, room_id: str) -> str | None:
    value: str | None = await conn.fetchval(
        "SELECT membership FROM local_current_membership WHERE user_id = $1 AND room_id = $2",
        user_id,
        room_id,
    )
    return value


async def current_state_event(conn: Conn, room_id: str, event_type: str, state_key: str) -> Event | None:
    """The event at (type, state_key) in the room's current state, as clients get it, or None."""
    records = await conn.fetch(
        _with_redactions(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE event_id = (SELECT event_id FROM current_state_events"
            " WHERE room_id = $1 AND type = $2 AND state_key = $3)"
        ),
        room_id,
        event_type,
        state_key,
    )
    return _read_event(records[0]) if records else None


async def current_state(conn: Conn, room_id: str) -> dict[tuple[str, str], str]:
    """(type, state_key) -> event_id of the room's current state."""
    records = await conn.fetch(
        "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = $1", room_id
    )
    return {(r["type"], r["state_key"]): r["event_id"] for r in records}


async def state_at(
    conn: Conn, room_id: str, upto: int, *, types: Sequence[str] | None = None, member: str | None = None
) -> list[Event]:
    """The room's state as of stream ordering `upto` (the last event of each (type, state_key) at
    or below it, backfilled ones included: the higher ordering wins, as in current state), sorted
    by (type, state_key). With `types`, only those types, plus `member`'s member event if given."""
    args: list[object] = [room_id, upto]
    clause = ""
    if types is not None:
        args += [list(types), member]
        clause = " AND (type = ANY($3::text[]) OR (type = 'm.room.member' AND state_key = $4))"
    records = await conn.fetch(
        _with_redactions(
            f"SELECT DISTINCT ON (type, state_key) {_EVENT_COLUMNS} FROM events"
            f" WHERE room_id = $1 AND stream_ordering <= $2 AND state_key IS NOT NULL{clause}"
            " ORDER BY type, state_key, stream_ordering DESC",
            "q.type, q.state_key",
        ),
        *args,
    )
    return [_read_event(r) for r in records]


async def visibility_changes(conn: Conn, room_id: str) -> tuple[tuple[int, str], ...]:
    """The room's `m.room.history_visibility` changes, (stream ordering, value) in stream order
    (backfilled ones first: they are older than every live event)."""
    records = await conn.fetch(
        "SELECT stream_ordering, json::jsonb->'content'->>'history_visibility' AS value FROM events"
        " WHERE room_id = $1 AND type = 'm.room.history_visibility' AND state_key = ''"
        " ORDER BY stream_ordering",
        room_id,
    )
    return tuple((r["stream_ordering"], str(r["value"])) for r in records)
