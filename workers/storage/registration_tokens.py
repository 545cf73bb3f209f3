"""Registration tokens: who may register when `registration: token`.

A registration takes a token in two steps, so that a token with one use left is never spent twice
and a registration that fails gives its use back: `reserve` (pending + 1, only while the token is
valid), then `complete` (pending - 1, completed + 1) or `release` (pending - 1).
"""

from __future__ import annotations

import secrets
import string
import time
from dataclasses import asdict, dataclass
from typing import Any, TypeGuard

from workers.errors import WorkerError
from workers.storage import Conn

#: The characters of a token, as the Matrix spec allows them.
TOKEN_CHARACTERS = string.ascii_letters + string.digits + "._~-"
MAX_TOKEN_LENGTH = 64
_VALID = (
    "(uses_allowed IS NULL OR pending + completed < uses_allowed)"
    " AND (expiry_time IS NULL OR expiry_time > $2)"
)
_COLUMNS = "token, uses_allowed, pending, completed, expiry_time"


class TokenExistsError(WorkerError):
    """A token of that name exists already."""


@dataclass(frozen=True, slots=True)
class RegistrationToken:
    token: str
    uses_allowed: int | None
    pending: int
    completed: int
    expiry_time: int | None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def now_ms() -> int:
    return int(time.time() * 1000)


def random_token(length: int) -> str:
    """Letters and digits only: a token is typed and pasted, and `-x` reads as an option."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(length))


def _token(record: Any) -> RegistrationToken:
    return RegistrationToken(**dict(record))


async def create(
    conn: Conn, token: str, uses_allowed: int | None, expiry_time: int | None
) -> RegistrationToken:
    record = await conn.fetchrow(
        "INSERT INTO registration_tokens (token, uses_allowed, expiry_time) VALUES ($1, $2, $3)"
        f" ON CONFLICT (token) DO NOTHING RETURNING {_COLUMNS}",
        token, uses_allowed, expiry_time,
    )  # fmt: skip
    if record is None:
        raise TokenExistsError(f"registration token {token!r} exists already")
    return _token(record)


async def get(conn: Conn, token: str) -> RegistrationToken | None:
    record = await conn.fetchrow(f"SELECT {_COLUMNS} FROM registration_tokens WHERE token = $1", token)
    return None if record is None else _token(record)


async def list_tokens(conn: Conn, valid: bool | None = None) -> list[RegistrationToken]:
    """Every token (by name); `valid` True or False: only those that can (cannot) be used now."""
    if valid is None:
        records = await conn.fetch(f"SELECT {_COLUMNS} FROM registration_tokens ORDER BY token")
    else:
        condition = _VALID.replace("$2", "$1")
        records = await conn.fetch(
            f"SELECT {_COLUMNS} FROM registration_tokens WHERE ({condition}) = $2 ORDER BY token",
            now_ms(),
            valid,
        )
    return [_token(r) for r in records]


async def update(conn: Conn, token: str, changes: dict[str, int | None]) -> RegistrationToken | None:
    """Set `uses_allowed` and/or `expiry_time` (the keys of `changes`); None when there is no such token."""
    columns = [c for c in ("uses_allowed", "expiry_time") if c in changes]
    if not columns:
        return await get(conn, token)
    assignments = ", ".join(f"{c} = ${i}" for i, c in enumerate(columns, start=2))
    record = await conn.fetchrow(
        f"UPDATE registration_tokens SET {assignments} WHERE token = $1 RETURNING {_COLUMNS}",
        token, *(changes[c] for c in columns),
    )  # fmt: skip
    return None if record is None else _token(record)


async def delete(conn: Conn, token: str) -> bool:
    return (
        await conn.fetchval("DELETE FROM registration_tokens WHERE token = $1 RETURNING true", token) is True
    )


async def is_valid(conn: Conn, token: str) -> bool:
    return bool(
        await conn.fetchval(
            f"SELECT true FROM registration_tokens WHERE token = $1 AND {_VALID}", token, now_ms()
        )
    )


async def reserve(conn: Conn, token: str) -> bool:
    """Hold one use of a valid token for a registration under way (pending + 1); False if invalid."""
    held = await conn.fetchval(
        f"UPDATE registration_tokens SET pending = pending + 1 WHERE token = $1 AND {_VALID} RETURNING true",
        token, now_ms(),
    )  # fmt: skip
    return held is True


async def complete(conn: Conn, token: str) -> None:
    await conn.execute(
        "UPDATE registration_tokens SET pending = pending - 1, completed = completed + 1 WHERE token = $1",
        token,
    )


async def release(conn: Conn, token: str) -> None:
    await conn.execute(
        "UPDATE registration_tokens SET pending = GREATEST(pending - 1, 0) WHERE token = $1", token
    )


def check_token_name(token: Any) -> str:
    """A token chosen by an admin: 1 to 64 of the spec's characters; ValueError otherwise."""
    if (
        not isinstance(token, str)
        or not 1 <= len(token) <= MAX_TOKEN_LENGTH
        or any(c not in TOKEN_CHARACTERS for c in token)
    ):
        raise ValueError(f"token must be 1 to {MAX_TOKEN_LENGTH} of A-Z, a-z, 0-9, '.', '_', '~', '-'")
    return token


def _int_or_none(value: Any, below: int) -> TypeGuard[int | None]:
    return value is None or (type(value) is int and 0 <= value < below)


def check_uses_allowed(value: Any) -> int | None:
    if not _int_or_none(value, 2**31):
        raise ValueError("uses_allowed must be a non-negative integer or null")
    return value


def check_expiry_time(value: Any) -> int | None:
    if not _int_or_none(value, 2**63):
        raise ValueError("expiry_time must be milliseconds since the epoch or null")
    if value is not None and value < now_ms():
        raise ValueError("expiry_time must not be in the past")
    return value
