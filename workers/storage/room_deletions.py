"""The `room_deletions` table: the Delete Room API's version 2 tasks and their status.

A task goes `shutting_down` (removing the members) -> `purging` (deleting the room) -> `complete`,
or `failed` with an error. `shutdown_room` is Synapse's result object (JSON), set once the members
are removed. Finished tasks are shown for a day after their last update, then deleted.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from workers.storage import Conn

RUNNING = ("shutting_down", "purging")
#: How long a finished task's status stays readable (Synapse's figure).
KEPT_MS = 24 * 3600 * 1000
EMPTY_RESULT: dict[str, Any] = {
    "kicked_users": [], "failed_to_kick_users": [], "local_aliases": [], "new_room_id": None,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Deletion:
    delete_id: str
    room_id: str
    status: str
    error: str | None
    shutdown_room: dict[str, Any]

    def to_json(self, *, with_id: bool) -> dict[str, Any]:
        """Synapse's status object (`delete_id` only when listed by room)."""
        body: dict[str, Any] = {"delete_id": self.delete_id} if with_id else {}
        body["status"] = self.status
        if self.status == "failed" and self.error is not None:
            body["error"] = self.error
        body["shutdown_room"] = self.shutdown_room
        return body


def _deletion(record: asyncpg.Record) -> Deletion:
    text = record["shutdown_room"]
    result = json.loads(text) if text is not None else dict(EMPTY_RESULT)
    return Deletion(record["delete_id"], record["room_id"], record["status"], record["error"], result)


async def running_for_room(conn: Conn, room_id: str) -> bool:
    found = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM room_deletions WHERE room_id = $1 AND status = ANY($2::text[]))",
        room_id,
        list(RUNNING),
    )
    return bool(found)


async def start(conn: Conn, room_id: str, instance_name: str) -> str:
    """Record a new task (`shutting_down`) run by `instance_name`; its delete id. Drops the tasks
    that finished more than a day ago."""
    now = int(time.time() * 1000)
    await conn.execute(
        "DELETE FROM room_deletions WHERE status <> ALL($1::text[]) AND updated_ts < $2",
        list(RUNNING),
        now - KEPT_MS,
    )
    delete_id = secrets.token_urlsafe(12)
    await conn.execute(
        "INSERT INTO room_deletions (delete_id, room_id, instance_name, status, created_ts, updated_ts)"
        " VALUES ($1, $2, $3, 'shutting_down', $4, $4)",
        delete_id,
        room_id,
        instance_name,
        now,
    )
    return delete_id


async def update(
    conn: Conn, delete_id: str, status: str, *, result: dict[str, Any] | None = None, error: str | None = None
) -> None:
    """Move a task on (keeping its result when `result` is None)."""
    await conn.execute(
        "UPDATE room_deletions SET status = $2, shutdown_room = coalesce($3, shutdown_room), error = $4,"
        " updated_ts = $5 WHERE delete_id = $1",
        delete_id,
        status,
        None if result is None else json.dumps(result),
        error,
        int(time.time() * 1000),
    )


async def interrupted(conn: Conn, instance_name: str) -> int:
    """Mark the tasks `instance_name` left unfinished (it stopped or died) failed; how many."""
    status = await conn.execute(
        "UPDATE room_deletions SET status = 'failed', error = $2, updated_ts = $3"
        " WHERE instance_name = $1 AND status = ANY($4::text[])",
        instance_name,
        f"interrupted: {instance_name} stopped before the deletion finished; send the request again",
        int(time.time() * 1000),
        list(RUNNING),
    )
    return int(status.split()[-1])


async def by_id(conn: Conn, delete_id: str) -> Deletion | None:
    record = await conn.fetchrow(
        "SELECT * FROM room_deletions WHERE delete_id = $1"
        " AND (status = ANY($2::text[]) OR updated_ts >= $3)",
        delete_id,
        list(RUNNING),
        int(time.time() * 1000) - KEPT_MS,
    )
    return None if record is None else _deletion(record)


async def by_room(conn: Conn, room_id: str) -> list[Deletion]:
    records = await conn.fetch(
        "SELECT * FROM room_deletions WHERE room_id = $1 AND (status = ANY($2::text[]) OR updated_ts >= $3)"
        " ORDER BY created_ts",
        room_id,
        list(RUNNING),
        int(time.time() * 1000) - KEPT_MS,
    )
    return [_deletion(r) for r in records]
