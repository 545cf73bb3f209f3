"""Room aliases (`#name:server` -> `!room:server`)."""

from __future__ import annotations

from workers.storage import Conn


async def add_alias(conn: Conn, alias: str, room_id: str, creator: str) -> bool:
    """Map `alias` to `room_id`; False when the alias is taken."""
    return bool(
        await conn.fetchval(
            "INSERT INTO room_aliases (room_alias, room_id, creator) VALUES ($1, $2, $3)"
            " ON CONFLICT DO NOTHING RETURNING 1",
            alias,
            room_id,
            creator,
        )
    )


async def room_for_alias(conn: Conn, alias: str) -> str | None:
    value: str | None = await conn.fetchval("SELECT room_id FROM room_aliases WHERE room_alias = $1", alias)
    return value


async def remove_alias(conn: Conn, alias: str) -> None:
    await conn.execute("DELETE FROM room_aliases WHERE room_alias = $1", alias)
