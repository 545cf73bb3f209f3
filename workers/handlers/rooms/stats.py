"""A background task that follows the events stream by its persisted-upto position.

Every event at or below persisted-upto is persisted, whichever writer wrote it, so processing
(progress, persisted_upto] in order never skips a row that a slow writer commits late. It keeps
moving while only one writer writes because idle writers announce their positions. Progress and
the statistics are written in one transaction, so a restart resumes exactly where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import asyncpg

from idgen import MultiWriterIdGenerator
from pubsub.tasks import cancel_and_wait
from workers.handlers.notify.notifier import Notifier

log = logging.getLogger(__name__)
TASK_NAME = "room_stats"


class RoomStatsTask:
    def __init__(
        self, pool: asyncpg.Pool, generator: MultiWriterIdGenerator, notifier: Notifier, *, page: int = 5000
    ) -> None:
        self._pool = pool
        self._gen = generator
        self._notifier = notifier
        self._page = page
        self.position = 0
        self.processed = 0
        self._task: asyncio.Task[None] | None = None

    async def load(self) -> None:
        async with self._pool.acquire() as conn:
            value = await conn.fetchval(
                "SELECT position FROM background_progress WHERE task_name = $1", TASK_NAME
            )
        self.position = int(value or 0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=TASK_NAME)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            try:
                while await self.step():
                    pass
            except (OSError, asyncpg.PostgresError) as e:
                log.warning("room stats step failed (%s); retrying", e)
                await asyncio.sleep(1.0)
            await self._notifier.wait_for_position(1.0)

    async def step(self) -> bool:
        """Process one page up to persisted-upto; True if there may be more."""
        upto = self._gen.get_current_token()
        if upto <= self.position:
            return False
        async with self._pool.acquire() as conn, conn.transaction():
            records = await conn.fetch(
                "SELECT stream_ordering, room_id, state_key"
                " FROM events WHERE stream_ordering > $1 AND stream_ordering <= $2"
                " ORDER BY stream_ordering LIMIT $3",
                self.position,
                upto,
                self._page,
            )
            end = records[-1]["stream_ordering"] if len(records) == self._page else upto
            messages: Counter[str] = Counter()
            state: Counter[str] = Counter()
            for r in records:
                if r["state_key"] is None:
                    messages[r["room_id"]] += 1
                else:
                    state[r["room_id"]] += 1
            rooms = sorted(set(messages) | set(state))
            if rooms:
                await conn.execute(
                    "INSERT INTO room_stats (room_id, messages, state_changes, joined_members)"
                    " SELECT r, m, s, (SELECT count(*) FROM local_current_membership l"
                    "   WHERE l.room_id = r AND l.membership = 'join')"
                    " FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(r, m, s)"
                    " ON CONFLICT (room_id) DO UPDATE SET messages = room_stats.messages + EXCLUDED.messages,"
                    " state_changes = room_stats.state_changes + EXCLUDED.state_changes,"
                    " joined_members = EXCLUDED.joined_members",
                    rooms,
                    [messages[r] for r in rooms],
                    [state[r] for r in rooms],
                )
            await conn.execute(
                "INSERT INTO background_progress (task_name, stream_name, position, updated_ts)"
                " VALUES ($1, 'events', $2, $3) ON CONFLICT (task_name) DO UPDATE"
                " SET position = EXCLUDED.position, updated_ts = EXCLUDED.updated_ts",
                TASK_NAME,
                end,
                int(time.time() * 1000),
            )
        self.position = end
        self.processed += len(records)
        return end < upto
