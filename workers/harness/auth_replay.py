"""Replay rooms' stored events through the Matrix authorization rules (`workers.harness.auth_rules`):
every live event (positive stream ordering) of each room, in stream order, as PostgreSQL holds them.
Harness only: a worker never imports it.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from workers.harness.auth_rules import ReplayResult, StoredEvent, replay
from workers.storage import Conn, connect

_EVENTS = (
    "SELECT stream_ordering, event_id, room_id, type, state_key, sender, json FROM events"
    " WHERE stream_ordering > 0{rooms} ORDER BY room_id, stream_ordering"
)


async def replay_stored(conn: Conn, room_ids: Collection[str] | None = None) -> ReplayResult:
    """Judge the stored live events of `room_ids` (None: every room) against the rules."""
    if room_ids is None:
        records = await conn.fetch(_EVENTS.format(rooms=""))
    else:
        records = await conn.fetch(_EVENTS.format(rooms=" AND room_id = ANY($1::text[])"), list(room_ids))
    events = []
    for r in records:
        content = json.loads(r["json"]).get("content")
        body = content if isinstance(content, dict) else {}
        ordering, event_id, room_id = r["stream_ordering"], r["event_id"], r["room_id"]
        events.append(StoredEvent(ordering, event_id, room_id, r["type"], r["sender"], body, r["state_key"]))
    return replay(events)


async def replay_database(database_url: str, room_ids: Collection[str] | None = None) -> ReplayResult:
    """`replay_stored` on a connection of its own."""
    async with connect(database_url) as conn:
        return await replay_stored(conn, room_ids)
