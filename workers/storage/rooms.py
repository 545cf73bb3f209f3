"""The `rooms` table (each room's version, and whether it lives on another server) and the invites
that remote servers sent to local users (a stand-in for federation's invite)."""

from __future__ import annotations

import json
from typing import Any

from workers.storage import Conn


async def room_version(conn: Conn, room_id: str) -> str | None:
    value = await conn.fetchval("SELECT room_version FROM rooms WHERE room_id = $1", room_id)
    return value if isinstance(value, str) else None


async def room_versions(conn: Conn, room_ids: list[str]) -> dict[str, str]:
    records = await conn.fetch(
        "SELECT room_id, room_version FROM rooms WHERE room_id = ANY($1::text[])", room_ids
    )
    return {r["room_id"]: r["room_version"] for r in records}


async def remote_room(conn: Conn, room_id: str) -> str | None:
    """The version of a room that lives on another server (None: not such a room)."""
    value = await conn.fetchval("SELECT room_version FROM rooms WHERE room_id = $1 AND is_remote", room_id)
    return value if isinstance(value, str) else None


async def store_remote_invite(
    conn: Conn,
    room_id: str,
    room_version: str,
    user_id: str,
    event_id: str,
    invite_state: list[dict[str, Any]],
) -> None:
    """Remember a remote room's version and the state its invite showed (for the invitee's sync)."""
    await conn.execute(
        "INSERT INTO rooms (room_id, room_version, is_remote) VALUES ($1, $2, true)"
        " ON CONFLICT (room_id) DO NOTHING",
        room_id,
        room_version,
    )
    await conn.execute(
        "INSERT INTO remote_invites (user_id, room_id, event_id, invite_state) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (user_id, room_id) DO UPDATE SET event_id = EXCLUDED.event_id,"
        " invite_state = EXCLUDED.invite_state",
        user_id,
        room_id,
        event_id,
        json.dumps(invite_state),
    )


async def remote_invite_state(conn: Conn, user_id: str, room_id: str) -> list[dict[str, Any]] | None:
    text = await conn.fetchval(
        "SELECT invite_state FROM remote_invites WHERE user_id = $1 AND room_id = $2", user_id, room_id
    )
    if text is None:
        return None
    value = json.loads(text)
    return value if isinstance(value, list) else []
