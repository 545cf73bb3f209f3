"""Events by the event they relate to (`m.relates_to.event_id`), through migration 0019's index:
what the client API's relation checks read (`workers.handlers.rooms.relations`)."""

from __future__ import annotations

from workers.storage import Conn

#: The event a stored event relates to, and the predicate that finds events with a relation, as
#: migration 0019 indexes them (a query must say both as written there for the index to serve it).
_RELATES_TO = "((json::jsonb) -> 'content' -> 'm.relates_to' ->> 'event_id')"
_HAS_RELATION = "strpos(json, '\"m.relates_to\"') > 0"


async def is_relation_target(conn: Conn, parent_id: str) -> bool:
    """Whether a stored event relates to `parent_id` (which may be an event this server lacks)."""
    return bool(
        await conn.fetchval(
            f"SELECT EXISTS (SELECT 1 FROM events WHERE {_RELATES_TO} = $1 AND {_HAS_RELATION})", parent_id
        )
    )


async def has_annotated(
    conn: Conn, room_id: str, parent_id: str, sender: str, event_type: str, key: str
) -> bool:
    """Whether `sender` has an annotation of `parent_id` of `event_type` with `key` stored and not
    redacted (a redacted reaction may be made again)."""
    return bool(
        await conn.fetchval(
            f"SELECT EXISTS (SELECT 1 FROM events WHERE {_RELATES_TO} = $2 AND {_HAS_RELATION}"
            " AND room_id = $1 AND sender = $3 AND type = $4"
            " AND (json::jsonb) -> 'content' -> 'm.relates_to' ->> 'rel_type' = 'm.annotation'"
            " AND (json::jsonb) -> 'content' -> 'm.relates_to' ->> 'key' = $5"
            " AND NOT EXISTS (SELECT 1 FROM redactions r WHERE r.redacts = events.event_id))",
            room_id,
            parent_id,
            sender,
            event_type,
            key,
        )
    )
