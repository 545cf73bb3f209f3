"""Retention of the invalidation log: rows older than `retention_days` are deleted in bounded batches.

There is no audit export watermark yet, so rows are pruned by age alone (`invalidation_ts`, in
milliseconds). Each batch deletes at most `batch` rows in its own short transaction, so pruning a
large backlog never holds a long lock or a long transaction; the task sleeps `interval_s` between
passes. A reader catching up never needs a row this old: catch-up starts from persisted positions.

The row with the highest ID stays, however old: the caches stream's workers keep no
`stream_positions` rows, so a worker starts the stream at the table's highest ID. With the table
emptied by a quiet week, a restarted cluster started it below the tokens its clients held, and
answered them "nothing new" until some worker wrote a caches row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import asyncpg

from idgen.multi_writer import DATABASE_ERRORS
from pubsub.ticks import sleep_to_next_run

log = logging.getLogger(__name__)
TASK_NAME = "prune_invalidations"
DAY_MS = 86_400_000

_DELETE_BATCH = """
DELETE FROM cache_invalidation_stream_by_instance
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM cache_invalidation_stream_by_instance WHERE invalidation_ts < $1
    AND stream_id < (SELECT max(stream_id) FROM cache_invalidation_stream_by_instance) LIMIT $2
))
"""


async def prune_older_than(pool: asyncpg.Pool[Any], cutoff_ms: int, batch: int) -> int:
    """Delete every row with `invalidation_ts < cutoff_ms`, `batch` rows a transaction; the count."""
    deleted = 0
    while True:
        status = await pool.execute(_DELETE_BATCH, cutoff_ms, batch)
        count = int(status.split()[-1])
        deleted += count
        if count < batch:
            return deleted


class InvalidationRetentionTask:
    """The background task: every `interval_s`, prune rows older than `retention_days`."""

    def __init__(
        self, pool: asyncpg.Pool[Any], retention_days: int, *, batch: int = 1000, interval_s: float = 3600.0
    ) -> None:
        self._pool = pool
        self._retention_ms = retention_days * DAY_MS
        self._batch = batch
        self._interval_s = interval_s
        self.pruned = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=TASK_NAME)

    async def _run(self) -> None:
        while True:
            try:
                cutoff = int(time.time() * 1000) - self._retention_ms
                count = await prune_older_than(self._pool, cutoff, self._batch)
                self.pruned += count
                if count:
                    log.info("pruned %d invalidation rows older than %d ms", count, cutoff)
            except DATABASE_ERRORS as e:
                log.warning("invalidation pruning failed (%s); retrying next pass", e)
            await sleep_to_next_run(self._interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
