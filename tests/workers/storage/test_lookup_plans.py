"""workers.storage: the hot lookups of events and keys read their indexes under any plan.

A plan made while a table was small and never analysed (a new database) chose sequential scans
and hash joins, and was kept as the table grew, until autovacuum's first ANALYZE. Each statement
is planned here as PostgreSQL would keep it (`tests.plans.generic_plan`) on small, never-analysed
tables; its plan must reach the tables by their indexes.
"""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import pytest

from tests.plans import generic_plan
from workers.storage import device_lists, receipts, to_device
from workers.storage import events as store
from workers.storage.one_time_keys import key_counts_of
from workers.storage.windows import Window

#: The tables that grow with use, and must never be read whole by a lookup.
GROWING = (
    "events", "redactions", "e2e_one_time_keys", "e2e_fallback_keys", "receipts", "device_inbox",
    "device_lists_stream",
)  # fmt: skip
#: The window of a sync: one writer named, the others at the stream's position.
WINDOW = Window({"w1": (2, 9)}, (0, 9))


class Recorder:
    """Passes `fetch` to a real connection and keeps each statement, its arguments and its rows."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements: list[tuple[str, tuple[object, ...]]] = []
        self.rows: list[list[asyncpg.Record]] = []

    async def fetch(self, query: str, *args: object) -> list[asyncpg.Record]:
        self.statements.append((query, args))
        self.rows.append(list(await self.conn.fetch(query, *args)))
        return self.rows[-1]


LOOKUPS = {
    "events_by_ids": lambda c: store.events_by_ids(c, ["$1", "$2", "$1"]),
    "events_at": lambda c: store.events_at(c, [1, 2]),
    "events_with_key_counts": lambda c: store.events_with_key_counts(c, ["$1"], [("@u:hs", "D")]),
    "key_counts_of": lambda c: key_counts_of(c, [("@u:hs", "D"), ("@v:hs", "E")]),
    "events_for_rooms": lambda c: store.events_for_rooms(c, ["!r:hs"], {"w1": (2, 9)}, (0, 9), 10),
    "room_events": lambda c: store.room_events(c, "!r:hs", after=2, upto=9, limit=10),
    "room_receipts": lambda c: receipts.room_receipts(c, ["!r:hs"], WINDOW),
    "messages_for_device": lambda c: to_device.messages_for_device(c, "@u:hs", "D", WINDOW, 10),
    "changed_users": lambda c: device_lists.changed_users(c, ["@u:hs", "@v:hs"], WINDOW),
}


@pytest.mark.parametrize("name", sorted(LOOKUPS))
async def test_a_lookup_reads_indexes_under_a_plan_made_on_small_tables(
    db_pool: asyncpg.Pool, name: str
) -> None:
    async with db_pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO events (stream_ordering, event_id, instance_name, room_id, type, state_key,"
            " sender, json, received_ts) SELECT i, '$' || i, 'w1', '!r:hs', 'm.room.message', NULL,"
            " '@u:hs', '{}', 0 FROM generate_series(1, 20) AS i"
        )
        assert await conn.fetchval("SELECT reltuples FROM pg_class WHERE relname = 'events'") == -1
        recorder = Recorder(conn)
        await LOOKUPS[name](recorder)
        (query, args), *_ = recorder.statements
        plan = await generic_plan(conn, query, args)
    scanned = re.findall(r"Seq Scan on (\w+)", plan)
    assert not set(scanned) & set(GROWING), plan


async def test_the_lookups_answer_as_before(db_pool: asyncpg.Pool) -> None:
    """Asked twice for one value, a lookup reads its row once; a value not stored, nothing."""
    async with db_pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO events (stream_ordering, event_id, instance_name, room_id, type, state_key,"
            " sender, json, received_ts) VALUES (1, '$1', 'w1', '!r:hs', 'm.room.message', NULL,"
            " '@u:hs', '{\"content\": {}}', 0)"
        )
        recorder = Recorder(conn)
        by_id = await store.events_by_ids(recorder, ["$1", "$1", "$9"])
        at = await store.events_at(recorder, [1, 1, 9])
        with_counts, counts = await store.events_with_key_counts(recorder, ["$1", "$1"], [("@u:hs", "D")])
    assert list(by_id) == ["$1"] and list(at) == [1] and list(with_counts) == ["$1"]
    assert [len(rows) for rows in recorder.rows] == [1, 1, 1]
    assert counts == {("@u:hs", "D"): ({"signed_curve25519": 0}, [])}
