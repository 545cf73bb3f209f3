"""Is Postgres reachable right now? A background probe, so /health answers without a query.

`PostgresProbe` runs `SELECT 1` on the pool every `interval_s`, but not more often than every
`MIN_INTERVAL_S` (each bounded by `interval_s`), and keeps the last outcome: `error` is None while
the last probe succeeded, else why it failed. The floor keeps a quiet worker's database round trips
down (a probe a second from every worker, for a readiness that load balancers poll every few
seconds); readiness follows an outage within `MIN_INTERVAL_S` plus the bound.

A read another loop makes anyway can stand for the probe (`observe`: the previous-release check
reads the database every 2 s on every worker): while such outcomes arrive, the probe sends no
statement of its own, and `error` is theirs. When they stop (that read hangs, or its loop ended),
the probe's own `SELECT 1` runs again within `OBSERVED_PERIODS` of its period.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

import asyncpg

from pubsub.ticks import sleep_to_next_run

#: The shortest time between two probes.
MIN_INTERVAL_S = 2.0
#: An outcome given to `observe` stands for the probe this many of its periods.
OBSERVED_PERIODS = 1.5


class PostgresProbe:
    """The last known reachability of the pool's server; `start()` then `stop()`."""

    def __init__(self, pool: asyncpg.Pool[Any], interval_s: float) -> None:
        self._pool = pool
        self._interval_s = interval_s
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._observed_at = -math.inf
        #: `SELECT 1`s sent, and probes that an observed outcome stood for.
        self.probes = self.observed = 0

    def observe(self, error: str | None) -> None:
        """The outcome of a database read made elsewhere just now: None, or why it failed."""
        self.error = error
        self._observed_at = time.monotonic()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="postgres-probe")

    async def _run(self) -> None:
        period = max(self._interval_s, MIN_INTERVAL_S)
        while True:
            if time.monotonic() - self._observed_at < OBSERVED_PERIODS * period:
                self.observed += 1
                await sleep_to_next_run(period)
                continue
            self.probes += 1
            try:
                async with asyncio.timeout(self._interval_s):  # not wait_for: its task would hide our name
                    await self._pool.fetchval("SELECT 1")
                self.error = None
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failure is "unreachable"; the reason is reported
                self.error = str(e) or type(e).__name__
            await sleep_to_next_run(period)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
