"""SQL of the receipts stream: per (room, receipt type, user, thread) the latest event read.

A receipt replaces the row of its key only when it is for a later event of the room (a client that
reads back in history does not move its receipt backwards, as Synapse's); the row carries the
stream id of the write that set it. Ids come from `receipts_stream_seq`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.storage import Conn
from workers.storage.windows import Window

#: ($1 room): the room's newest receipt row, (instance_name, stream_id) (`workers.handlers.placement.leases`).
LAST_WRITE = (
    "SELECT instance_name, stream_id FROM receipts WHERE room_id = $1 ORDER BY stream_id DESC LIMIT 1"
)

#: The unthreaded receipt's `thread_id` in the table (a thread id is never empty).
NO_THREAD = ""


@dataclass(frozen=True, slots=True)
class StoredReceipt:
    """One receipt as stored, in the order of the wire row (Synapse's receipts stream)."""

    room_id: str
    receipt_type: str
    user_id: str
    event_id: str
    thread_id: str | None
    data: dict[str, Any]


def _receipt(r: Any) -> StoredReceipt:
    return StoredReceipt(
        r["room_id"],
        r["receipt_type"],
        r["user_id"],
        r["event_id"],
        r["thread_id"] or None,
        json.loads(r["data"]),
    )


_COLUMNS = "room_id, receipt_type, user_id, event_id, thread_id, data"


async def event_position(conn: Conn, event_id: str) -> tuple[str, int] | None:
    """(room, stream ordering) of a stored event; None when there is no such event."""
    record = await conn.fetchrow("SELECT room_id, stream_ordering FROM events WHERE event_id = $1", event_id)
    return None if record is None else (record["room_id"], record["stream_ordering"])


async def later_than_held(
    conn: Conn, room_id: str, receipt_type: str, user_id: str, thread_id: str | None, ordering: int
) -> bool:
    """Whether a receipt for the event at `ordering` would move the user's receipt forward."""
    held = await conn.fetchval(
        "SELECT event_stream_ordering FROM receipts WHERE room_id = $1 AND receipt_type = $2"
        " AND user_id = $3 AND thread_id = $4",
        room_id, receipt_type, user_id, thread_id or NO_THREAD,
    )  # fmt: skip
    return held is None or held < ordering


async def put_receipt(
    conn: Conn, receipt: StoredReceipt, ordering: int, stream_id: int, instance: str
) -> bool:
    """Store `receipt` (for the event at `ordering`) unless the user's receipt of that key is for
    the same or a later event; whether it was stored."""
    stored = await conn.fetchval(
        "INSERT INTO receipts (room_id, receipt_type, user_id, thread_id, event_id, event_stream_ordering,"
        " data, stream_id, instance_name) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        " ON CONFLICT (room_id, receipt_type, user_id, thread_id) DO UPDATE SET event_id = EXCLUDED.event_id,"
        " event_stream_ordering = EXCLUDED.event_stream_ordering, data = EXCLUDED.data,"
        " stream_id = EXCLUDED.stream_id, instance_name = EXCLUDED.instance_name"
        " WHERE receipts.event_stream_ordering < EXCLUDED.event_stream_ordering RETURNING 1",
        receipt.room_id, receipt.receipt_type, receipt.user_id, receipt.thread_id or NO_THREAD,
        receipt.event_id, ordering, json.dumps(receipt.data), stream_id, instance,
    )  # fmt: skip
    return bool(stored)


async def receipts_by_writer(
    conn: Conn, instance: str, low: int, high: int, limit: int
) -> list[tuple[int, StoredReceipt]]:
    """The stream's rows of `instance` in (low, high], in stream order, the first `limit` (a row
    replaced since by a later receipt of its key is read as that one, at its newer id)."""
    records = await conn.fetch(
        f"SELECT stream_id, {_COLUMNS} FROM receipts WHERE instance_name = $1 AND stream_id > $2"
        " AND stream_id <= $3 ORDER BY stream_id LIMIT $4",
        instance, low, high, limit,
    )  # fmt: skip
    return [(r["stream_id"], _receipt(r)) for r in records]


async def room_receipts(conn: Conn, room_ids: Sequence[str], window: Window) -> list[StoredReceipt]:
    """The receipts of `room_ids` set inside `window`, in stream order."""
    records = await conn.fetch(
        f"SELECT {_COLUMNS} FROM receipts WHERE room_id = ANY($1::text[]) AND {window.condition(2)}"
        " ORDER BY stream_id",
        list(room_ids), *window.params(),
    )  # fmt: skip
    return [_receipt(r) for r in records]
