"""SQL of the account_data stream: global account data, room account data and room tags.

Three tables, one stream: each table takes its stream ids from `account_data_stream_seq`, so an id
is unique across the three. A change replaces the row of its key (user, [room,] type) and carries
the stream id of the write; an upsert never replaces a row with a newer id (two writes of one key
may commit out of order). A change of a room's tags moves the room's `room_tags_revisions` row,
whose stream rows say `m.tag`.
"""

from __future__ import annotations

import json
from typing import Any

from workers.storage import Conn
from workers.storage.windows import Window

#: ($1 user): the user's newest row of the stream, (instance_name, stream_id)
#: (`workers.handlers.placement.leases`).
LAST_WRITE = """
SELECT instance_name, stream_id FROM (
    (SELECT instance_name, stream_id FROM account_data WHERE user_id = $1
     ORDER BY stream_id DESC LIMIT 1)
    UNION ALL
    (SELECT instance_name, stream_id FROM room_account_data WHERE user_id = $1
     ORDER BY stream_id DESC LIMIT 1)
    UNION ALL
    (SELECT instance_name, stream_id FROM room_tags_revisions WHERE user_id = $1
     ORDER BY stream_id DESC LIMIT 1)
) AS rows ORDER BY stream_id DESC LIMIT 1
"""

TAG_TYPE = "m.tag"
#: One stream row: (stream id, user id, room id or None, account data type).
AccountDataChange = tuple[int, str, str | None, str]


async def put_global(
    conn: Conn, user_id: str, kind: str, content: dict[str, Any], stream_id: int, instance: str
) -> bool:
    """Set it at `stream_id`; False when it holds `content` already (a retried PUT whose first try
    committed, perhaps on another writer: not written, nor delivered, twice)."""
    status = await conn.execute(
        "INSERT INTO account_data (user_id, account_data_type, content, stream_id, instance_name)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (user_id, account_data_type) DO UPDATE"
        " SET content = EXCLUDED.content, stream_id = EXCLUDED.stream_id,"
        " instance_name = EXCLUDED.instance_name WHERE account_data.stream_id < EXCLUDED.stream_id"
        " AND account_data.content <> EXCLUDED.content",
        user_id, kind, json.dumps(content), stream_id, instance,
    )  # fmt: skip
    return status != "INSERT 0 0"


async def put_room(
    conn: Conn, user_id: str, room_id: str, kind: str, content: dict[str, Any], stream_id: int, instance: str
) -> bool:
    """As `put_global`, for a room's account data."""
    status = await conn.execute(
        "INSERT INTO room_account_data (user_id, room_id, account_data_type, content, stream_id,"
        " instance_name) VALUES ($1, $2, $3, $4, $5, $6)"
        " ON CONFLICT (user_id, room_id, account_data_type) DO UPDATE"
        " SET content = EXCLUDED.content, stream_id = EXCLUDED.stream_id,"
        " instance_name = EXCLUDED.instance_name WHERE room_account_data.stream_id < EXCLUDED.stream_id"
        " AND room_account_data.content <> EXCLUDED.content",
        user_id, room_id, kind, json.dumps(content), stream_id, instance,
    )  # fmt: skip
    return status != "INSERT 0 0"


async def set_tag(
    conn: Conn,
    user_id: str,
    room_id: str,
    tag: str,
    content: dict[str, Any] | None,
    stream_id: int,
    instance: str,
) -> None:
    """Add or replace a tag (`content` None: remove it), and move the room's tag revision."""
    if content is None:
        await conn.execute(
            "DELETE FROM room_tags WHERE user_id = $1 AND room_id = $2 AND tag = $3", user_id, room_id, tag
        )
    else:
        await conn.execute(
            "INSERT INTO room_tags (user_id, room_id, tag, content) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (user_id, room_id, tag) DO UPDATE SET content = EXCLUDED.content",
            user_id, room_id, tag, json.dumps(content),
        )  # fmt: skip
    await conn.execute(
        "INSERT INTO room_tags_revisions (user_id, room_id, stream_id, instance_name) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (user_id, room_id) DO UPDATE SET stream_id = EXCLUDED.stream_id,"
        " instance_name = EXCLUDED.instance_name WHERE room_tags_revisions.stream_id < EXCLUDED.stream_id",
        user_id, room_id, stream_id, instance,
    )  # fmt: skip


async def get_global(conn: Conn, user_id: str, kind: str) -> dict[str, Any] | None:
    text = await conn.fetchval(
        "SELECT content FROM account_data WHERE user_id = $1 AND account_data_type = $2", user_id, kind
    )
    return None if text is None else _object(text)


async def get_room(conn: Conn, user_id: str, room_id: str, kind: str) -> dict[str, Any] | None:
    text = await conn.fetchval(
        "SELECT content FROM room_account_data"
        " WHERE user_id = $1 AND room_id = $2 AND account_data_type = $3",
        user_id, room_id, kind,
    )  # fmt: skip
    return None if text is None else _object(text)


async def get_tags(conn: Conn, user_id: str, room_id: str) -> dict[str, dict[str, Any]]:
    records = await conn.fetch(
        "SELECT tag, content FROM room_tags WHERE user_id = $1 AND room_id = $2 ORDER BY tag",
        user_id,
        room_id,
    )
    return {r["tag"]: _object(r["content"]) for r in records}


async def changes_by_writer(
    conn: Conn, instance: str, low: int, high: int, limit: int
) -> list[AccountDataChange]:
    """The stream's rows of `instance` with low < id <= high, from the three tables merged by
    stream id alone (two tables may hold the same id: one with a room, one without), the first
    `limit`."""
    records = await conn.fetch(
        "SELECT stream_id, user_id, NULL::text AS room_id, account_data_type FROM account_data"
        " WHERE instance_name = $1 AND stream_id > $2 AND stream_id <= $3"
        " UNION ALL SELECT stream_id, user_id, room_id, account_data_type FROM room_account_data"
        " WHERE instance_name = $1 AND stream_id > $2 AND stream_id <= $3"
        f" UNION ALL SELECT stream_id, user_id, room_id, '{TAG_TYPE}' FROM room_tags_revisions"
        " WHERE instance_name = $1 AND stream_id > $2 AND stream_id <= $3"
        " ORDER BY stream_id LIMIT $4",
        instance, low, high, limit,
    )  # fmt: skip
    return [(r["stream_id"], r["user_id"], r["room_id"], r["account_data_type"]) for r in records]


async def changed_for_user(
    conn: Conn, user_id: str, window: Window
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The user's account data that changed inside `window`, as Matrix events in stream order:
    (global events, room id -> the room's events, `m.tag` with every tag of the room)."""
    condition = window.condition(2)
    tag_condition = window.condition(2, "r.instance_name", "r.stream_id")
    params = window.params()
    global_records = await conn.fetch(
        f"SELECT account_data_type, content FROM account_data WHERE user_id = $1 AND {condition}"
        " ORDER BY stream_id",
        user_id, *params,
    )  # fmt: skip
    room_records = await conn.fetch(
        "SELECT stream_id, room_id, account_data_type, content FROM room_account_data"
        f" WHERE user_id = $1 AND {condition}"
        " UNION ALL SELECT r.stream_id, r.room_id, NULL, (SELECT coalesce(json_object_agg(t.tag,"
        " t.content::json), '{}')::text FROM room_tags t WHERE t.user_id = r.user_id AND t.room_id ="
        f" r.room_id) FROM room_tags_revisions r WHERE r.user_id = $1 AND {tag_condition}"
        " ORDER BY 1",
        user_id, *params,
    )  # fmt: skip
    rooms: dict[str, list[dict[str, Any]]] = {}
    for r in room_records:
        kind = r["account_data_type"]
        content = _object(r["content"])
        event = (
            {"type": kind, "content": content} if kind else {"type": TAG_TYPE, "content": {"tags": content}}
        )
        rooms.setdefault(r["room_id"], []).append(event)
    events = [{"type": r["account_data_type"], "content": _object(r["content"])} for r in global_records]
    return events, rooms


def _object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    return value if isinstance(value, dict) else {}
