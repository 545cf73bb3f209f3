"""A generator's start-up read: every position it starts from, checked against the sequence and the
stream's tables, and repaired where that is safe (`load_positions`).

Where we differ from Synapse:

* Positions come from `stream_positions` only; we never read stream rows above a stale minimum (Synapse's
  5-minute start-up). That is sound because a row only ever holds a position the writer had reached
  (a claim that stays true however late it lands), and every writer upserts its position at
  start-up before it allocates anything. So a writer without a visible
  row allocates only after our read, above every value we read: it may safely be assumed at
  persisted-upto. A row that is stale (a crash between commit and upsert) only holds positions back
  until that writer restarts; it never lets a position pass an ID still being written.
* persisted-upto at start = min(the sequence's max allocated, read *before* the rows; every configured
  writer's row). This writer's own position = the sequence's max allocated (it has allocated nothing yet).
* The first ID of a plain `CREATE SEQUENCE` is 1, and an empty stream's persisted-upto is 0: we read the
  sequence's `is_called`, so there is no Synapse "streams start at 2" rule and no `nextval` recipe needed.
* Consistency: a sequence behind a stream table is moved forward (setval, warning naming both); a
  `stream_positions` row ahead of the sequence (read *after* the rows, after any repair) refuses start-up.
* Without `track_positions_table` (the caches stream) persisted-upto starts at the tables' maximum,
  or at a row of the stream in `stream_positions` when that is higher. Its workers write none: the
  row is the restore procedure's mark (`workers.harness.backup`), written while no worker runs, at
  the moved sequence, so that the stream starts above every token issued before the restore.

The reads are index-backed aggregates (one row per table, never a scan), the sequence state and the
stream's `stream_positions` rows; a writer then upserts its own position (and deletes the rows of
instances no longer configured as writers). Must not import asyncio tasks or the lane: one
connection, given by the caller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from idgen.errors import InconsistentSequenceError
from idgen.positions import StreamPositions

if TYPE_CHECKING:
    from idgen._lane import Connection

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StreamTable:
    """A table holding rows of a stream: its name, the writer's instance column and the ID column."""

    table: str
    instance_column: str
    id_column: str


@dataclass(frozen=True, slots=True)
class StartupRead:
    """What a generator reads at start: identifiers already checked as plain SQL names. `sign` is
    1 for a positive stream, -1 for a negative one; `upsert_sql` is the generator's own position
    upsert ($1 stream, $2 instance, $3 signed position)."""

    stream_name: str
    instance: str
    sequence: str
    tables: tuple[StreamTable, ...]
    writers: tuple[str, ...]
    sign: int
    track: bool
    upsert_sql: str


async def load_positions(conn: Connection, read: StartupRead) -> tuple[StreamPositions, int]:
    """The positions to start from, and the own position this writer stored (0 for a reader).
    Raises InconsistentSequenceError when `stream_positions` is ahead of the sequence."""
    sign = read.sign
    table_max = await _tables_max(conn, read)
    seq_before = await sequence_max(conn, read.sequence)
    behind = [(t, m) for t, m in zip(read.tables, table_max, strict=True) if m > seq_before]
    if behind:
        for t, m in behind:
            log.warning(
                "sequence is behind a stream table, moving it forward: sequence=%s table=%s "
                "sequence_max=%d table_max=%d stream=%s",
                read.sequence, t.table, seq_before, m, read.stream_name,
            )  # fmt: skip
        await conn.fetchval(f"SELECT setval('{read.sequence}', $1)", max(m for _, m in behind))
        seq_before = await sequence_max(conn, read.sequence)
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = $1", read.stream_name
    )
    # Read after the rows: every value in them was allocated before this read.
    seq_after = await sequence_max(conn, read.sequence)
    stored = {r["instance_name"]: sign * int(r["stream_id"]) for r in rows}
    if stored and max(stored.values()) > seq_after:
        name, pos = max(stored.items(), key=lambda item: item[1])
        raise InconsistentSequenceError(
            f"stream {read.stream_name!r}: stream_positions says instance {name!r} reached "
            f"{sign * pos}, but sequence {read.sequence!r} has only handed out up to {sign * seq_after} "
            "(sequence values were lost, e.g. by a failover, or two generators share this stream name). "
            f"Fix: stop every process writing this stream, run SELECT setval('{read.sequence}', {pos}); "
            f"(or DELETE FROM stream_positions WHERE stream_name = '{read.stream_name}';), then restart."
        )
    is_writer = not read.writers or read.instance in read.writers
    if read.track:
        others = {n: p for n, p in stored.items() if n in read.writers and n != read.instance}
        persisted = min([seq_before, *others.values()])
        own = seq_after
    else:
        others = {}
        persisted = min(max([*table_max, *stored.values()]), seq_after)
        own = persisted
    book = StreamPositions(
        read.instance,
        read.writers,
        persisted_upto=persisted,
        positions=others,
        own_position=own if is_writer else None,
    )
    own_stored = 0
    if read.track and is_writer:
        stale = [n for n in stored if n not in read.writers]
        if stale:
            log.info(
                "forgetting positions of removed writers: stream=%s instances=%s", read.stream_name, stale
            )
            await conn.execute(
                "DELETE FROM stream_positions WHERE stream_name = $1 AND instance_name = ANY($2::text[])",
                read.stream_name,
                stale,
            )
        own_stored = book.own_position()
        await conn.execute(read.upsert_sql, read.stream_name, read.instance, sign * own_stored)
    log.debug(
        "id generator loaded: stream=%s instance=%s persisted_upto=%d positions=%s",
        read.stream_name, read.instance, sign * book.persisted_upto, book.positions(),
    )  # fmt: skip
    return book, own_stored


def sequence_max_sql(sequence: str) -> str:
    """A subquery: the highest value `sequence` handed out (0 before its first), in-flight values
    included."""
    return f"(SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {sequence})"


async def sequence_max(conn: Connection, sequence: str) -> int:
    """The value of `sequence_max_sql`."""
    return int(await conn.fetchval(f"SELECT {sequence_max_sql(sequence)}"))


async def _tables_max(conn: Connection, read: StartupRead) -> list[int]:
    """The largest internal (positive) ID in each table, 0 when empty."""
    agg = "MAX" if read.sign == 1 else "MIN"
    parts = ", ".join(f"(SELECT {agg}({t.id_column}) FROM {t.table})" for t in read.tables)
    row = await conn.fetchrow(f"SELECT {parts}")
    assert row is not None
    return [max(read.sign * int(v), 0) if v is not None else 0 for v in row]
