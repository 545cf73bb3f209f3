"""A background task that follows the events stream by its persisted-upto position.

Every event at or below persisted-upto is persisted, whichever writer wrote it, so processing
(progress, persisted_upto] in order never skips a row that a slow writer commits late. It keeps
moving while only one writer writes because idle writers announce their positions. A page's
statistics and the progress past it are one statement (`STEP_SQL`), so a restart resumes exactly
where it stopped. While events arrive the task works at most every `STEP_PAUSE_S` (statistics are an
aggregate nobody waits on, and a step per event batch cost five round trips each time); at rest
it looks on the shared clock's ticks (`pubsub.ticks`).
"""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg

from idgen import MultiWriterIdGenerator
from pubsub.tasks import cancel_and_wait
from pubsub.ticks import until_next_run
from workers.handlers.notify.notifier import Notifier

log = logging.getLogger(__name__)
TASK_NAME = "room_stats"
#: The pause after the task caught up, before it looks again (while events keep arriving).
STEP_PAUSE_S = 0.25
#: One page: (progress, persisted-upto] counted per room into `room_stats`, the progress moved
#: to where the page ended (its last event when full, else persisted-upto); (end, events counted).
STEP_SQL = (
    "WITH page AS (SELECT stream_ordering, room_id, state_key FROM events"
    "   WHERE stream_ordering > $1 AND stream_ordering <= $2 ORDER BY stream_ordering LIMIT $3),"
    " counted AS (SELECT room_id AS r, count(*) FILTER (WHERE state_key IS NULL) AS m,"
    "   count(*) FILTER (WHERE state_key IS NOT NULL) AS s FROM page GROUP BY room_id),"
    " stats AS (INSERT INTO room_stats (room_id, messages, state_changes, joined_members)"
    "   SELECT r, m, s, (SELECT count(*) FROM local_current_membership l"
    "     WHERE l.room_id = r AND l.membership = 'join')"
    "   FROM counted ORDER BY r"
    "   ON CONFLICT (room_id) DO UPDATE SET messages = room_stats.messages + EXCLUDED.messages,"
    "   state_changes = room_stats.state_changes + EXCLUDED.state_changes,"
    "   joined_members = EXCLUDED.joined_members),"
    " ended AS (SELECT CASE WHEN count(*) = $3 THEN max(stream_ordering) ELSE $2 END AS e,"
    "   count(*) AS n FROM page),"
    " progress AS (INSERT INTO background_progress (task_name, stream_name, position, updated_ts)"
    "   SELECT $4, 'events', e, $5 FROM ended ON CONFLICT (task_name) DO UPDATE"
    "   SET position = EXCLUDED.position, updated_ts = EXCLUDED.updated_ts)"
    " SELECT e, n FROM ended"
)


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
            await self._notifier.wait_for_position(until_next_run(1.0))
            if self._gen.get_current_token() > self.position:
                await asyncio.sleep(STEP_PAUSE_S)  # events arrive: let a burst of them gather

    async def step(self) -> bool:
        """Process one page up to persisted-upto; True if there may be more."""
        upto = self._gen.get_current_token()
        if upto <= self.position:
            return False
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                STEP_SQL, self.position, upto, self._page, TASK_NAME, int(time.time() * 1000)
            )
        assert row is not None
        end, counted = int(row["e"]), int(row["n"])
        self.position = end
        self.processed += counted
        return end < upto
