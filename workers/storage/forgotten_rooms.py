"""Rooms a user forgot (`POST /rooms/{roomId}/forget`), and which of them /sync leaves out.

A forget records the stream ordering of the user's membership event it forgot (a leave or a ban).
The room is forgotten while that is still the user's latest membership in it: a later invite or
join shows the room again, with no clean-up on the persist path. A forget racing with a join
records the older position, so the join wins.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from workers.model import UserRooms
from workers.storage import Conn

#: Memberships a user may forget a room from (Synapse's rule: forget only what you are not in).
FORGETTABLE = frozenset({"leave", "ban"})


async def forget_room(conn: Conn, user_id: str, room_id: str) -> str | None:
    """Forget `room_id` for `user_id` if their membership allows; the membership that refused it
    (join, invite, knock), else None. A user who never had a membership forgets nothing."""
    record = await conn.fetchrow(
        "SELECT membership, event_stream_ordering FROM local_current_membership"
        " WHERE user_id = $1 AND room_id = $2",
        user_id,
        room_id,
    )
    if record is None:
        return None
    if record["membership"] not in FORGETTABLE:
        return str(record["membership"])
    await conn.execute(
        "INSERT INTO forgotten_rooms (user_id, room_id, membership_stream_ordering, forgotten_ts)"
        " VALUES ($1, $2, $3, $4) ON CONFLICT (user_id, room_id) DO UPDATE"
        " SET membership_stream_ordering = EXCLUDED.membership_stream_ordering,"
        " forgotten_ts = EXCLUDED.forgotten_ts",
        user_id, room_id, record["event_stream_ordering"], int(time.time() * 1000),
    )  # fmt: skip
    return None


async def forgotten_positions(conn: Conn, user_id: str) -> dict[str, int]:
    """room -> the stream ordering of the membership `user_id` forgot there (one indexed read)."""
    records = await conn.fetch(
        "SELECT room_id, membership_stream_ordering FROM forgotten_rooms WHERE user_id = $1", user_id
    )
    return {r["room_id"]: r["membership_stream_ordering"] for r in records}


def forgotten(user_rooms: UserRooms, positions: Mapping[str, int]) -> set[str]:
    """The rooms of `user_rooms` the user forgot and has had no membership in since: what /sync
    leaves out of `rooms.leave` (`positions` from `forgotten_positions`)."""
    out: set[str] = set()
    for room_id, position in positions.items():
        history = user_rooms.history.get(room_id)
        if history and history[-1][0] <= position and history[-1][1] in FORGETTABLE:
            out.add(room_id)
    return out


async def forgotten_rooms(conn: Conn, user_id: str, user_rooms: UserRooms) -> set[str]:
    """`forgotten` of the user's rooms now: the one call /sync needs."""
    positions = await forgotten_positions(conn, user_id)
    return forgotten(user_rooms, positions) if positions else set()
