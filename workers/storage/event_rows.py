"""The `events` rows a persister writes: a few in one INSERT (guarded by a condition, or taking
stream orderings its own statement allocates), many in one binary COPY.

The columns are `EVENT_COLUMNS`, the order reads select them in too (`workers.storage.events`).
A batch of messages alone is one statement (`needs_transaction`), which commits as it runs; what a
statement that allocated its own orderings wrote is found by event id (`written_by`) when its
answer was lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workers.model import REDACTION_EVENT, Event
from workers.storage import Conn

#: The columns of `events` that reads select and `copy_event_rows` writes, in this order.
EVENT_COLUMNS = (
    "stream_ordering", "instance_name", "event_id", "room_id", "type", "state_key", "sender", "json",
    "received_ts",
)  # fmt: skip
_EVENT_COLUMNS = ", ".join(EVENT_COLUMNS)


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


#: Columns of `own_rows_statement`'s rows: `EVENT_COLUMNS` but the stream ordering, with the stored
#: JSON in its two parts (`Event.json_parts`).
_OWN_ROW_COLUMNS = "instance_name, event_id, room_id, type, state_key, sender, head, tail, received_ts, o"


def own_rows_statement(
    events: Sequence[Event], parts: Sequence[tuple[str, str, str]], guard: Guard | None, probed: bool
) -> tuple[str, tuple[object, ...]]:
    """The one INSERT that writes a few `events` rows (1 to `INSERT_MAX_ROWS`) with stream
    orderings its own statement allocates (`idgen.MultiWriterIdGenerator.ride_mult(own=True)`):
    the k-th row written gets `ids`' k-th ID, in its column and in its stored JSON (between the
    parts of `Event.json_parts`). The events' own stream orderings are not used. With `probed`,
    the events whose id the allocation's probe found (`found`) are left out; with `guard`, nothing
    is written unless it holds. (SQL, arguments) for `Ride.carry`."""
    if not events or len(events) > INSERT_MAX_ROWS:
        raise ValueError(f"one INSERT writes 1 to {INSERT_MAX_ROWS} event rows, not {len(events)}")
    left_out = " WHERE r.event_id NOT IN (SELECT v FROM found)" if probed else ""
    sql = (
        f"INSERT INTO events ({_EVENT_COLUMNS}) SELECT ids.id, u.instance_name, u.event_id, u.room_id,"
        " u.type, u.state_key, u.sender, u.head || ids.id || u.tail, u.received_ts"
        " FROM (SELECT r.*, row_number() OVER (ORDER BY r.o) AS k FROM unnest($1::text[], $2::text[],"
        " $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[])"
        f" WITH ORDINALITY AS r({_OWN_ROW_COLUMNS}){left_out}) AS u JOIN ids USING (k)"
    )
    columns = (
        [e.instance_name for e in events], [e.event_id for e in events], [e.room_id for e in events],
        [e.type for e in events], [e.state_key for e in events], [e.sender for e in events],
        [p[0] for p in parts], [p[1] for p in parts], [e.received_ts for e in events],
    )  # fmt: skip
    if guard is None:
        return sql, columns
    return f"{sql} WHERE {guard.condition}", (*columns, *guard.args)


async def written_by(conn: Conn, instance_name: str, event_ids: Sequence[str], above: int) -> dict[str, int]:
    """Event id -> stream ordering of the rows of `event_ids` that `instance_name` wrote above
    stream ordering `above`: what a statement that allocated its own orderings wrote, once it is
    known to be over (`workers.storage.commit_outcome.committed`)."""
    records = await conn.fetch(
        "SELECT event_id, stream_ordering FROM events WHERE event_id = ANY($1::text[])"
        " AND instance_name = $2 AND stream_ordering > $3",
        list(event_ids), instance_name, above,
    )  # fmt: skip
    return {r["event_id"]: r["stream_ordering"] for r in records}


def needs_transaction(events: Sequence[Event], invalidations: Sequence[object]) -> bool:
    """Whether `insert_batch` will run more than one statement for this batch."""
    return bool(invalidations) or any(e.state_key is not None or e.type == REDACTION_EVENT for e in events)
