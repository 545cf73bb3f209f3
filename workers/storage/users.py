"""Accounts and access tokens. Only a SHA-256 of a token is stored; the token itself is shown once."""

from __future__ import annotations

import hashlib
import secrets
import time

from workers.errors import WorkerError
from workers.storage import Conn


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class UserExistsError(WorkerError):
    """The user id is taken: registration never hands out a token for an existing account."""


async def register(conn: Conn, user_id: str) -> str:
    """Create the user and return its access token; raises UserExistsError if it exists."""
    token = secrets.token_urlsafe(32)
    now = int(time.time() * 1000)
    async with conn.transaction():
        created = await conn.fetchval(
            "INSERT INTO users (user_id, created_ts) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1",
            user_id,
            now,
        )
        if created is None:
            raise UserExistsError(user_id)
        await conn.execute(
            "INSERT INTO access_tokens (token_hash, user_id, created_ts) VALUES ($1, $2, $3)",
            token_hash(token),
            user_id,
            now,
        )
    return token


async def user_for_token(conn: Conn, token: str) -> str | None:
    user: str | None = await conn.fetchval(
        "SELECT user_id FROM access_tokens WHERE token_hash = $1", token_hash(token)
    )
    return user
