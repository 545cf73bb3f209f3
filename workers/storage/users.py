"""Accounts, devices, access tokens, uploaded sync filters and registration nonces.

Only a SHA-256 of an access token is stored; the token itself is shown once. Passwords arrive here
already hashed (`workers.storage.passwords`).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from workers.errors import WorkerError
from workers.model import KEYS_PER_INVALIDATION
from workers.storage import Conn


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _now_ms() -> int:
    return int(time.time() * 1000)


class UserExistsError(WorkerError):
    """The user id is taken: registration never hands out a token for an existing account."""


@dataclass(frozen=True, slots=True)
class Requester:
    """Who an access token belongs to."""

    user_id: str
    device_id: str | None


@dataclass(frozen=True, slots=True)
class Session:
    """A fresh login: the token is only ever seen here."""

    user_id: str
    device_id: str
    access_token: str


async def create_user(conn: Conn, user_id: str, password_hash: str | None, admin: bool = False) -> None:
    """Create the account; raises UserExistsError if the id is taken."""
    created = await conn.fetchval(
        "INSERT INTO users (user_id, created_ts, password_hash, admin) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT DO NOTHING RETURNING 1",
        user_id,
        _now_ms(),
        password_hash,
        admin,
    )
    if created is None:
        raise UserExistsError(user_id)


async def delete_user(conn: Conn, user_id: str) -> None:
    """Remove an account that never got a session (a registration that could not finish)."""
    async with conn.transaction():
        await conn.execute("DELETE FROM access_tokens WHERE user_id = $1", user_id)
        await conn.execute("DELETE FROM devices WHERE user_id = $1", user_id)
        await conn.execute("DELETE FROM users WHERE user_id = $1", user_id)


async def user_exists(conn: Conn, user_id: str) -> bool:
    return bool(await conn.fetchval("SELECT 1 FROM users WHERE user_id = $1", user_id))


async def password_hash(conn: Conn, user_id: str) -> str | None:
    value: str | None = await conn.fetchval("SELECT password_hash FROM users WHERE user_id = $1", user_id)
    return value


async def new_session(
    conn: Conn, user_id: str, device_id: str | None = None, display_name: str | None = None
) -> Session:
    """A device (created unless it exists) and a new access token on it."""
    device = device_id or new_device_id()
    token = "fo_" + secrets.token_urlsafe(32)
    now = _now_ms()
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO devices (user_id, device_id, display_name, created_ts) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (user_id, device_id) DO UPDATE"
            " SET display_name = coalesce(EXCLUDED.display_name, devices.display_name)",
            user_id,
            device,
            display_name,
            now,
        )
        await conn.execute(
            "INSERT INTO access_tokens (token_hash, user_id, created_ts, device_id) VALUES ($1, $2, $3, $4)",
            token_hash(token),
            user_id,
            now,
            device,
        )
    return Session(user_id, device, token)


async def create_device(conn: Conn, user_id: str, device_id: str, display_name: str | None) -> bool:
    """Create a device unless it exists; True when it is new."""
    created = await conn.fetchval(
        "INSERT INTO devices (user_id, device_id, display_name, created_ts) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (user_id, device_id) DO NOTHING RETURNING 1",
        user_id,
        device_id,
        display_name,
        _now_ms(),
    )
    return created is not None


async def rename_device(conn: Conn, user_id: str, device_id: str, display_name: str | None) -> bool:
    """Set a device's display name; False when there is no such device."""
    found = await conn.fetchval(
        "UPDATE devices SET display_name = $3 WHERE user_id = $1 AND device_id = $2 RETURNING 1",
        user_id,
        device_id,
        display_name,
    )
    return found is not None


async def delete_devices(
    conn: Conn,
    user_id: str,
    device_ids: list[str] | None,
    except_device: str | None = None,
    except_token: bytes | None = None,
) -> tuple[list[str], list[bytes]]:
    """Delete devices (None: all of the user's) with their access tokens (None: every token of the
    user, one without a device too), keeping `except_device` and the token hashed `except_token`
    (a password change keeps the session that made it); the device ids and token hashes deleted."""
    records = await conn.fetch(
        "DELETE FROM devices WHERE user_id = $1 AND ($2::text[] IS NULL OR device_id = ANY($2::text[]))"
        " AND device_id IS DISTINCT FROM $3 RETURNING device_id",
        user_id,
        device_ids,
        except_device,
    )
    deleted = [r["device_id"] for r in records]
    tokens = await conn.fetch(
        "DELETE FROM access_tokens WHERE user_id = $1"
        " AND ($2::text[] IS NULL OR device_id = ANY($2::text[])) AND token_hash IS DISTINCT FROM $3"
        " RETURNING token_hash",
        user_id,
        device_ids,
        except_token,
    )
    return deleted, [r["token_hash"] for r in tokens]


async def set_password_hash(conn: Conn, user_id: str, password_hash: str) -> None:
    await conn.execute("UPDATE users SET password_hash = $2 WHERE user_id = $1", user_id, password_hash)


async def list_devices(conn: Conn, user_id: str) -> list[tuple[str, str | None]]:
    """(device id, display name) of each of the user's devices."""
    records = await conn.fetch(
        "SELECT device_id, display_name FROM devices WHERE user_id = $1 ORDER BY device_id", user_id
    )
    return [(r["device_id"], r["display_name"]) for r in records]


def new_device_id() -> str:
    return "".join(secrets.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(10))


async def requester_for_token(conn: Conn, token: str) -> Requester | None:
    return await requester_for_hash(conn, token_hash(token))


async def requester_for_hash(conn: Conn, hashed: bytes) -> Requester | None:
    """The owner of the token whose `token_hash` is `hashed`; None when no such token exists."""
    record = await conn.fetchrow("SELECT user_id, device_id FROM access_tokens WHERE token_hash = $1", hashed)
    return None if record is None else Requester(record["user_id"], record["device_id"])


def ended_token_keys(hashes: list[bytes]) -> list[str] | None:
    """The caches-stream keys telling readers these tokens ended (their hex hashes); None (every
    cached token) when they do not fit in one row."""
    return [h.hex() for h in hashes] if len(hashes) <= KEYS_PER_INVALIDATION else None


async def log_out(conn: Conn, token: str) -> Requester | None:
    """Delete the token and its device (with the device's other tokens); the requester it was."""
    async with conn.transaction():
        record = await conn.fetchrow(
            "DELETE FROM access_tokens WHERE token_hash = $1 RETURNING user_id, device_id", token_hash(token)
        )
        if record is None:
            return None
        requester = Requester(record["user_id"], record["device_id"])
        if requester.device_id is not None:
            await delete_device(conn, requester.user_id, requester.device_id)
    return requester


async def delete_device(conn: Conn, user_id: str, device_id: str) -> list[bytes]:
    """Delete a device and its tokens; the hashes of the tokens deleted."""
    rows = await conn.fetch(
        "DELETE FROM access_tokens WHERE user_id = $1 AND device_id = $2 RETURNING token_hash",
        user_id,
        device_id,
    )
    await conn.execute("DELETE FROM devices WHERE user_id = $1 AND device_id = $2", user_id, device_id)
    return [r["token_hash"] for r in rows]


async def log_out_all(conn: Conn, user_id: str) -> list[bytes]:
    """Delete every token and device of the user; the hashes of the tokens deleted."""
    async with conn.transaction():
        rows = await conn.fetch("DELETE FROM access_tokens WHERE user_id = $1 RETURNING token_hash", user_id)
        await conn.execute("DELETE FROM devices WHERE user_id = $1", user_id)
    return [r["token_hash"] for r in rows]


async def add_filter(conn: Conn, user_id: str, json_text: str) -> int:
    """Store a sync filter; its id, unique per user."""
    filter_id: int = await conn.fetchval(
        "INSERT INTO user_filters (user_id, filter_id, json)"
        " SELECT $1, coalesce(max(filter_id) + 1, 0), $2 FROM user_filters WHERE user_id = $1"
        " RETURNING filter_id",
        user_id,
        json_text,
    )
    return filter_id


async def get_filter(conn: Conn, user_id: str, filter_id: int) -> str | None:
    value: str | None = await conn.fetchval(
        "SELECT json FROM user_filters WHERE user_id = $1 AND filter_id = $2", user_id, filter_id
    )
    return value


async def new_nonce(conn: Conn) -> str:
    nonce = secrets.token_hex(16)
    await conn.execute(
        "INSERT INTO registration_nonces (nonce, created_ts) VALUES ($1, $2)", nonce, _now_ms()
    )
    return nonce


async def take_nonce(conn: Conn, nonce: str, max_age_ms: int) -> bool:
    """Consume `nonce`: True once, if it was issued less than `max_age_ms` ago. Expired ones go too."""
    now = _now_ms()
    await conn.execute("DELETE FROM registration_nonces WHERE created_ts < $1", now - max_age_ms)
    return bool(await conn.fetchval("DELETE FROM registration_nonces WHERE nonce = $1 RETURNING 1", nonce))
