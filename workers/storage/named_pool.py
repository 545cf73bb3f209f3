"""Every database transaction named and timed: a pool whose `acquire()` blocks are measured.

A worker's unit of database work is one `async with pool.acquire() as conn:` block (a transaction
when it opens one, a few statements otherwise), as Synapse's is one `runInteraction(desc, ...)`.
Its name is where it is opened, `module.Class.function` (found from the caller's frame, skipping
asyncpg's own helpers such as `pool.fetch`), so every block carries one without each call site
spelling it, start-up ones (ID generator loads, catch-ups) included; a block opened where the
frame says little (the worker's start-up) passes `acquire(name=...)`. A connection taken with
`await pool.acquire()` and held (the ID generators' sequence lane) or opened alone (the instance
lease's session) is not a block: its owner times its statements itself, through `observe_held`.

`TransactionTimer` observes each block's time holding the connection in
`fanout_db_transaction_seconds{name}`, the wait for a free connection in
`fanout_db_pool_wait_seconds`, and for each block held longer than the threshold logs one line
and counts it in `fanout_db_slow_transactions_total{name}`.
"""

from __future__ import annotations

import logging
import sys
import time
from types import FrameType
from typing import Any

import asyncpg
from asyncpg.pool import PoolAcquireContext
from prometheus_client import CollectorRegistry, Counter

from pubsub.histograms import HistogramChild, LockFreeHistogram

log = logging.getLogger(__name__)
_SKIPPED = ("asyncpg", __name__)
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class TransactionTimer:
    """The histograms and the slow-transaction log of one worker."""

    def __init__(self, registry: CollectorRegistry, slow_s: float) -> None:
        self.slow_s = slow_s
        self._duration = LockFreeHistogram(
            "fanout_db_transaction_seconds",
            "Time a named database transaction (an acquire block) held its connection",
            ["name"], registry, BUCKETS,
        )  # fmt: skip
        self._wait = LockFreeHistogram(
            "fanout_db_pool_wait_seconds",
            "Time a database transaction waited for a free pool connection",
            [], registry, BUCKETS,
        ).labels()  # fmt: skip
        self._slow = Counter(
            "fanout_db_slow_transactions",
            "Named database transactions held longer than db_slow_transaction_s (each also logged)",
            ["name"],
            registry=registry,
        )
        self._by_name: dict[str, HistogramChild] = {}

    def observe(self, name: str, waited_s: float, held_s: float) -> None:
        self._wait.observe(waited_s)
        self._held(name, held_s, f" waited={waited_s:.3f}s")

    def observe_held(self, name: str, held_s: float) -> None:
        """A statement on a connection taken outside the pool's blocks (no pool wait to report)."""
        self._held(name, held_s, "")

    def _held(self, name: str, held_s: float, waited: str) -> None:
        child = self._by_name.get(name)
        if child is None:
            child = self._by_name[name] = self._duration.labels(name)
        child.observe(held_s)
        if held_s >= self.slow_s:
            self._slow.labels(name).inc()
            log.warning("slow database transaction name=%s took=%.3fs%s", name, held_s, waited)


def caller_name(frame: FrameType | None) -> str:
    """`module.qualname` of the first frame outside asyncpg and this module."""
    while frame is not None and frame.f_globals.get("__name__", "").startswith(_SKIPPED):
        frame = frame.f_back
    if frame is None:
        return "unknown"
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"


class _NamedAcquire(PoolAcquireContext):
    __slots__ = ("_asked", "_name", "_started", "_timer")

    def __init__(self, pool: NamedPool, timeout: float | None, name: str, timer: TransactionTimer) -> None:
        super().__init__(pool, timeout)
        self._name = name
        self._timer = timer
        self._asked = self._started = 0.0

    async def __aenter__(self) -> Any:
        self._asked = time.perf_counter()
        connection = await super().__aenter__()
        self._started = time.perf_counter()
        return connection

    async def __aexit__(self, *exc: object) -> None:
        held = time.perf_counter() - self._started
        try:
            await super().__aexit__(*exc)
        finally:
            self._timer.observe(self._name, self._started - self._asked, held)


class NamedPool(asyncpg.Pool):
    """asyncpg's pool, each `async with acquire()` block named and timed once `timer` is set."""

    timer: TransactionTimer | None = None
    #: It reaches PostgreSQL through a transaction pooler (`storage.create_pool`): a connection's
    #: backend is then the pooler's choice per transaction, not `get_server_pid()`.
    transaction_pooler: bool = False

    def acquire(self, *, timeout: float | None = None, name: str | None = None) -> PoolAcquireContext:
        """asyncpg's `acquire`; `name` replaces the caller's own (see the module's docstring)."""
        timer = self.timer
        if timer is None:
            return super().acquire(timeout=timeout)
        return _NamedAcquire(self, timeout, name or caller_name(sys._getframe(1)), timer)
