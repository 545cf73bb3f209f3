"""SQL of a room's end on this server: who must leave before a purge, the purge itself, whether a
room id is blocked (`blocked_rooms`), and whether any local user is still in a room (the clean-up
after the last one left).

The purge keeps one thing of the room: each former member's last membership event (their leave or
ban) with its `local_current_membership` row, and marks the room forgotten for them. That is what
a former member's incremental /sync needs to show the room under `leave` once; their initial /sync
no longer lists a forgotten room.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from workers.model import PRESENT
from workers.storage import Conn

#: Memberships that keep a user in a room (what the purge ends with a leave).
BLOCKED_ROOM = "This room has been blocked on this server"


@dataclass(frozen=True, slots=True)
class Purged:
    """What a purge removed: the room's local aliases, the number of events deleted and the users
    whose membership rows it touched (their room lists changed)."""

    local_aliases: list[str]
    events_deleted: int
    members: list[str]


async def present_members(conn: Conn, room_id: str, server_name: str) -> list[str]:
    """The local users joined, invited or knocking in the room, in user id order."""
    records = await conn.fetch(
        "SELECT user_id FROM local_current_membership WHERE room_id = $1 AND membership = ANY($2::text[])"
        " AND right(user_id, length($3) + 1) = ':' || $3 ORDER BY user_id",
        room_id,
        list(PRESENT),
        server_name,
    )
    return [r["user_id"] for r in records]


async def any_local_member(conn: Conn, room_id: str, server_name: str) -> bool:
    """Whether a local user is still joined, invited or knocking in the room."""
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM local_current_membership WHERE room_id = $1"
            " AND membership = ANY($2::text[]) AND right(user_id, length($3) + 1) = ':' || $3)",
            room_id,
            list(PRESENT),
            server_name,
        )
    )


async def room_known(conn: Conn, room_id: str) -> bool:
    """Whether the room lives here: a `rooms` row or current state (a purged room has neither,
    only its former members' leaves; a purge of an unknown id only blocks it)."""
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM rooms WHERE room_id = $1)"
            " OR EXISTS (SELECT 1 FROM current_state_events WHERE room_id = $1)",
            room_id,
        )
    )


async def is_blocked(conn: Conn, room_id: str) -> bool:
    found = await conn.fetchval("SELECT EXISTS (SELECT 1 FROM blocked_rooms WHERE room_id = $1)", room_id)
    return bool(found)


async def block_room(conn: Conn, room_id: str, user_id: str) -> None:
    await conn.execute(
        "INSERT INTO blocked_rooms (room_id, user_id, blocked_ts) VALUES ($1, $2, $3)"
        " ON CONFLICT (room_id) DO NOTHING",
        room_id,
        user_id,
        int(time.time() * 1000),
    )


async def all_members(conn: Conn, room_id: str) -> list[str]:
    """Every user with a membership row in the room (present or former), in user id order."""
    records = await conn.fetch(
        "SELECT user_id FROM local_current_membership WHERE room_id = $1 ORDER BY user_id", room_id
    )
    return [r["user_id"] for r in records]


async def purge_room(conn: Conn, room_id: str) -> Purged:
    """Delete the room's events, state, aliases, receipts, statistics and invites; keep each
    former member's last membership event (leave or ban) and row, forgotten. Call inside a
    transaction, after every local member left (`present_members` is empty): a user still joined
    would keep a row naming a deleted event."""
    members = await all_members(conn, room_id)
    # Rows of users still present (remote users; local ones left first) would name deleted events.
    await conn.execute(
        "DELETE FROM local_current_membership WHERE room_id = $1 AND membership = ANY($2::text[])",
        room_id,
        list(PRESENT),
    )
    kept = [
        r["event_id"]
        for r in await conn.fetch("SELECT event_id FROM local_current_membership WHERE room_id = $1", room_id)
    ]
    await conn.execute(
        "DELETE FROM redactions WHERE redacts IN (SELECT event_id FROM events WHERE room_id = $1"
        " AND event_id <> ALL($2::text[]))",
        room_id,
        kept,
    )
    status = await conn.execute(
        "DELETE FROM events WHERE room_id = $1 AND event_id <> ALL($2::text[])", room_id, kept
    )
    await conn.execute("DELETE FROM current_state_events WHERE room_id = $1", room_id)
    aliases = [
        r["room_alias"]
        for r in await conn.fetch("DELETE FROM room_aliases WHERE room_id = $1 RETURNING room_alias", room_id)
    ]
    for table in ("rooms", "room_stats", "receipts", "remote_invites"):
        await conn.execute(f"DELETE FROM {table} WHERE room_id = $1", room_id)
    now = int(time.time() * 1000)
    await conn.execute(
        "INSERT INTO forgotten_rooms (user_id, room_id, membership_stream_ordering, forgotten_ts)"
        " SELECT user_id, room_id, event_stream_ordering, $2 FROM local_current_membership"
        " WHERE room_id = $1 ON CONFLICT (user_id, room_id) DO UPDATE"
        " SET membership_stream_ordering = EXCLUDED.membership_stream_ordering,"
        " forgotten_ts = EXCLUDED.forgotten_ts",
        room_id,
        now,
    )
    return Purged(sorted(aliases), int(status.split()[-1]), members)
