"""Is Postgres reachable right now? A background probe, so /health answers without a query.

`PostgresProbe` runs `SELECT 1` on the pool every `interval_s`, but not more often than every
`MIN_INTERVAL_S` (each bounded by `interval_s`), and keeps the last outcome: `error` is None while
the last probe succeeded, else why it failed. The floor keeps a quiet worker's database round trips
down (a probe a second from every worker, for a readiness that load balancers poll every few
seconds); readiness follows an outage within `MIN_INTERVAL_S` plus the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg

from pubsub.ticks import sleep_to_next_run

#: The shortest time between two probes.
MIN_INTERVAL_S = 2.0


class PostgresProbe:
    """The last known reachability of the pool's server; `start()` then `stop()`."""

    def __init__(self, pool: asyncpg.Pool[Any], interval_s: float) -> None:
        self._pool = pool
        self._interval_s = interval_s
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="postgres-probe")

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self._interval_s):  # not wait_for: its task would hide our name
                    await self._pool.fetchval("SELECT 1")
                self.error = None
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failure is "unreachable"; the reason is reported
                self.error = str(e) or type(e).__name__
            await sleep_to_next_run(max(self._interval_s, MIN_INTERVAL_S))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
