"""Whether a user is a server admin (the `admin` column of `users`): who may call the admin API
and who the rate limits let through."""

from __future__ import annotations

from workers.storage import Conn


async def is_admin(conn: Conn, user_id: str) -> bool:
    return bool(await conn.fetchval("SELECT admin FROM users WHERE user_id = $1", user_id))
