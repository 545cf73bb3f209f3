"""One-time and fallback keys: uploads on the user's device_lists writer, claims on any worker.

An upload runs on the writer that records the user's device-key changes (`UserStreamWrites` of
the device_lists stream, as device keys do), in one transaction: one user's uploads are applied
one at a time, so "this key id is already stored with other content" is decided against what the
device holds. It writes no stream row: a key count is not a device-list change, and /sync reads the
counts of the syncing device as it answers.

A claim needs no writer: one PostgreSQL statement picks and deletes each key
(`workers.storage.one_time_keys.claim_keys`), so claims racing on any workers never share a key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from workers.handlers.stream_writes import UserStreamWrites, object_arg, text_arg
from workers.storage import Conn
from workers.storage import one_time_keys as store
from workers.storage.one_time_keys import ClaimedKey, KeyConflict, UploadedKey

#: Longest algorithm name or key id taken (both are short identifiers in every known algorithm).
MAX_NAME = 255


class KeyUploadRefused(Exception):
    """The writer refused an upload: no such device (`M_INVALID_PARAM`), or a key id held with
    other content (`M_UNKNOWN`, as Synapse answers it)."""

    def __init__(self, errcode: str, message: str) -> None:
        super().__init__(message)
        self.errcode = errcode


@dataclass(frozen=True, slots=True)
class KeyCounts:
    """What a device is told of its keys: one-time keys left per algorithm, unused fallback kinds."""

    one_time: dict[str, int]
    unused_fallback: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"one_time_key_counts": self.one_time, "unused_fallback_key_types": self.unused_fallback}


def parse_keys(value: Any, field: str) -> list[UploadedKey]:
    """The keys of an upload's `one_time_keys` or `fallback_keys` (`{"algorithm:key_id": key}`,
    a key an object or a string); ValueError saying what is wrong."""
    if value is None:
        return []
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be an object of algorithm:key_id -> key")
    keys: list[UploadedKey] = []
    for name, key in value.items():
        algorithm, _, key_id = name.partition(":")
        if not algorithm or not key_id or len(name) > MAX_NAME or not name.isprintable():
            raise ValueError(f"{field}: {name[:80]!r} is not algorithm:key_id")
        if not isinstance(key, dict | str):
            raise ValueError(f"{field}[{name!r}] must be an object or a string")
        keys.append(UploadedKey(algorithm, key_id, json.dumps(key, sort_keys=True, separators=(",", ":"))))
    return keys


def claimed_json(claimed: Sequence[ClaimedKey]) -> dict[str, dict[str, dict[str, Any]]]:
    """user -> device -> {"algorithm:key_id": key}, as `/keys/claim` answers."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for c in claimed:
        out.setdefault(c.user_id, {})[c.device_id] = {c.key.name: json.loads(c.key.key_json)}
    return out


async def read_counts(conn: Conn, user_id: str, device_id: str) -> KeyCounts:
    return KeyCounts(*await store.key_counts(conn, user_id, device_id))


class OneTimeKeys:
    def __init__(self, writes: UserStreamWrites, pool: asyncpg.Pool) -> None:
        self.writes = writes
        self._pool = pool
        writes.ops["upload_keys"] = self._upload

    async def upload(self, user_id: str, device_id: str, one_time_keys: Any, fallback_keys: Any) -> KeyCounts:
        """Store the device's one-time and fallback keys (checked with `parse_keys` first);
        the counts after. Raises ValueError, KeyUploadRefused, OwnerUnavailable."""
        parse_keys(one_time_keys, "one_time_keys")
        parse_keys(fallback_keys, "fallback_keys")
        answer = await self.writes.run(
            user_id,
            "upload_keys",
            {
                "user_id": user_id, "device_id": device_id,
                "one_time_keys": one_time_keys or {}, "fallback_keys": fallback_keys or {},
            },
        )  # fmt: skip
        error = answer.get("error")
        if isinstance(error, str):
            errcode = answer.get("errcode")
            raise KeyUploadRefused(errcode if isinstance(errcode, str) else "M_UNKNOWN", error)
        counts, fallback = answer.get("one_time_key_counts"), answer.get("unused_fallback_key_types")
        if not isinstance(counts, dict) or not isinstance(fallback, list):
            raise ValueError("the device_lists writer answered without key counts")
        return KeyCounts(counts, fallback)

    async def counts(self, user_id: str, device_id: str) -> KeyCounts:
        async with self._pool.acquire() as conn:
            return await read_counts(conn, user_id, device_id)

    async def claim(self, wanted: Sequence[tuple[str, str, str]]) -> list[ClaimedKey]:
        """One key per (user, device, algorithm) that has one (see `store.claim_keys`)."""
        async with self._pool.acquire() as conn:
            return await store.claim_keys(conn, wanted)

    # -- on the writer ---------------------------------------------------------------------------

    async def _upload(self, args: dict[str, Any]) -> dict[str, Any]:
        user_id, device_id = text_arg(args, "user_id"), text_arg(args, "device_id")
        one_time = parse_keys(object_arg(args, "one_time_keys"), "one_time_keys")
        fallback = parse_keys(object_arg(args, "fallback_keys"), "fallback_keys")
        try:
            async with self._pool.acquire() as conn:
                async with conn.transaction():
                    await store.add_one_time_keys(conn, user_id, device_id, one_time, int(time.time() * 1000))
                    await store.set_fallback_keys(conn, user_id, device_id, fallback)
                counts = await read_counts(conn, user_id, device_id)
        except KeyConflict as e:  # an answer, not a failure of the request: no retries
            return {"errcode": "M_UNKNOWN", "error": str(e)}
        except asyncpg.ForeignKeyViolationError:
            return {"errcode": "M_INVALID_PARAM", "error": f"{user_id} has no device {device_id}"}
        return counts.to_json()
