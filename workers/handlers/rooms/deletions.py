"""The Delete Room API's version 2 on the room's writer: a deletion runs as a task there, and its
status is kept in the database (`workers.storage.room_deletions`), so any worker answers for it.

The writer records the task and answers its delete id at once; the task runs `RoomEnd.purge`, which
moves the status to `purging` once the members left and to `complete` in the purge's own
transaction. A task that fails is marked `failed` with its error. One that a stop interrupts is
marked `failed` when the writer starts again (`interrupted`): the room is whole or purged, never
half, and the request can be sent again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import asyncpg

from workers.errors import RoomRuleError
from workers.handlers.rooms.purge import PurgeOptions, RoomEnd
from workers.handlers.rooms.rules import BadEvent, NotFound
from workers.storage import purge as purge_store
from workers.storage import room_deletions as store

log = logging.getLogger(__name__)


class RoomDeletions:
    def __init__(self, pool: asyncpg.Pool, instance_name: str, end: RoomEnd) -> None:
        self._pool = pool
        self._instance = instance_name
        self._end = end
        self._tasks: set[asyncio.Task[None]] = set()

    async def interrupted(self) -> None:
        """At start-up: the tasks this writer left unfinished failed (say so, once)."""
        async with self._pool.acquire() as conn:
            count = await store.interrupted(conn, self._instance)
        if count:
            log.warning("room deletions interrupted by the last stop: %d marked failed", count)

    async def start(self, room_id: str, options: PurgeOptions) -> str:
        """Record and start a deletion; its delete id. NotFound for a room unknown here (version 2
        cannot block an unknown room), BadEvent while another deletion of the room runs."""
        async with self._pool.acquire() as conn, conn.transaction():
            if not await purge_store.room_known(conn, room_id):
                raise NotFound(f"Unknown room id {room_id}")
            if await store.running_for_room(conn, room_id):
                raise BadEvent(f"History purge already in progress for {room_id}")
            delete_id = await store.start(conn, room_id, self._instance)
        task = asyncio.create_task(
            self._run(room_id, dataclasses.replace(options, delete_id=delete_id)),
            name=f"delete-room-{delete_id}",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return delete_id

    async def _run(self, room_id: str, options: PurgeOptions) -> None:
        assert options.delete_id is not None
        try:
            await self._end.purge(room_id, options)
        except Exception as e:
            if isinstance(e, RoomRuleError | OSError | asyncpg.PostgresError):
                log.warning("room deletion failed room=%s delete_id=%s: %s", room_id, options.delete_id, e)
            else:
                log.error("room deletion failed room=%s delete_id=%s", room_id, options.delete_id, exc_info=e)
            try:
                async with self._pool.acquire() as conn:
                    await store.update(conn, options.delete_id, "failed", error=str(e) or type(e).__name__)
            except (OSError, asyncpg.PostgresError) as again:
                log.warning("could not record the failure delete_id=%s: %s", options.delete_id, again)

    async def stop(self) -> None:
        """Let running deletions finish (the caller bounds the wait; one cut short is marked
        failed at the next start)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
