"""Whether workers of the previous release run beside this one (a rolling upgrade), and what this
release does differently while they do.

A worker of the previous release holds its instance name with a session advisory lock; this
release's workers hold a lease row (`workers.process.instance_lease`). `PreviousRelease` checks at start
and then every `CHECK_INTERVAL_S` (`workers.storage.migrate.previous_release_workers`) and keeps
`live`. While it is True, the handlers run in compatibility mode:
* rooms stay where the previous release routes them, the stable hash over the configured events
  writers (`workers.routing.writer_for_room`): this worker routes by it alone, and a persister
  takes the lease only of rooms that hash to it (a write for another room is refused unprocessed,
  a 503 both releases retry), so no room moves to a writer old workers would not send it to;
* a claim whose writer answers that it has no such operation is run here, as the previous
  release does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from idgen.multi_writer import DATABASE_DOWN, DATABASE_ERRORS
from pubsub.ticks import sleep_to_next_run
from workers.routing import writer_for_room
from workers.storage.migrate import previous_release_workers

log = logging.getLogger(__name__)
#: How often a worker looks again; the compatibility mode ends this long after the last old worker.
CHECK_INTERVAL_S = 2.0


class PreviousRelease:
    """`live`: a worker of the previous release held an instance name under `prefix` at the last
    check. `check()` once before serving, then `start()` .. `stop()`."""

    def __init__(self, pool: asyncpg.Pool[Any], prefix: str, interval_s: float = CHECK_INTERVAL_S) -> None:
        self._pool = pool
        self._prefix = prefix
        self._interval_s = interval_s
        self.live = False
        self._task: asyncio.Task[None] | None = None
        #: Told each periodic check's outcome (None, or why the server could not be reached; a
        #: server's own error is not told): the reachability probe's, which then sends no
        #: statement of its own.
        self.on_outcome: Callable[[str | None], None] = lambda error: None

    async def check(self) -> bool:
        """Look now; `live` after."""
        async with self._pool.acquire() as conn:
            names = await previous_release_workers(conn, self._prefix)
        self._set(names)
        return self.live

    def _set(self, names: list[str]) -> None:
        live = bool(names)
        if live == self.live:
            return
        self.live = live
        if live:
            log.warning("workers of the previous release run (%s): compatibility mode", ", ".join(names))
        else:
            log.info("no worker of the previous release runs: compatibility mode ends")

    def hashed_writer(self, room_id: str, writers: Sequence[str]) -> str | None:
        """While `live`, the only persister that may take `room_id`'s lease; else None (any)."""
        return writer_for_room(room_id, writers) if self.live else None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="previous-release-check")

    async def _run(self) -> None:
        while True:
            await sleep_to_next_run(self._interval_s)
            try:
                await self.check()
            except DATABASE_ERRORS as e:
                log.warning("previous-release check failed, live=%s kept: %s", self.live, e or type(e))
                if isinstance(e, DATABASE_DOWN):  # not reached; a server's own error is left to the probe
                    self.on_outcome(str(e) or type(e).__name__)
            else:
                self.on_outcome(None)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
