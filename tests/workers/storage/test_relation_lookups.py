"""The lookups of events by the event they relate to find them through migration 0019's index, and
find only what they should: not a redacted reaction, not another sender's or another key's."""

from __future__ import annotations

import asyncpg

from workers.model import Event
from workers.storage import relations as store
from workers.storage.migrate import apply_migrations

ROOM = "!r:hs"


def _reaction(ordering: int, event_id: str, sender: str, key: str, parent: str = "$m") -> Event:
    relates = {"rel_type": "m.annotation", "event_id": parent, "key": key}
    return Event(ordering, "p1", event_id, ROOM, "m.reaction", sender, {"m.relates_to": relates}, None, 0)


async def test_relation_lookups(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await apply_migrations(conn)
        for event in (_reaction(1, "$r1", "@a:hs", "+1"), _reaction(2, "$r2", "@b:hs", "-1", "$gone")):
            await conn.execute(
                "INSERT INTO events (stream_ordering, event_id, instance_name, room_id, type, state_key,"
                " sender, json, received_ts) VALUES ($1, $2, 'p1', $3, $4, NULL, $5, $6, 0)",
                event.stream_ordering, event.event_id, ROOM, event.type, event.sender, event.to_json(),
            )  # fmt: skip
        assert await store.has_annotated(conn, ROOM, "$m", "@a:hs", "m.reaction", "+1")
        assert not await store.has_annotated(conn, ROOM, "$m", "@a:hs", "m.reaction", "-1")
        assert not await store.has_annotated(conn, ROOM, "$m", "@b:hs", "m.reaction", "+1")
        assert not await store.has_annotated(conn, ROOM, "$m", "@a:hs", "m.other", "+1")
        assert await store.is_relation_target(conn, "$gone") and not await store.is_relation_target(
            conn, "$x"
        )
        await conn.execute("INSERT INTO redactions VALUES ('$r1', '$redaction', '11')")
        assert not await store.has_annotated(conn, ROOM, "$m", "@a:hs", "m.reaction", "+1")
        await conn.execute("SET enable_seqscan = off")
        plan = await conn.fetch(
            f"EXPLAIN SELECT 1 FROM events WHERE {store._RELATES_TO} = $1 AND {store._HAS_RELATION}", "$m"
        )
        assert "events_relates_to_idx" in "\n".join(r[0] for r in plan)
    finally:
        await conn.close()
