"""The record of what this worker applied from the caches stream, for the audit's reconciliation.

Contract (table `replication_applied_ranges`, migration 0002): one row per (worker, run, writer)
claims that every caches row of that writer with from_id < stream_id <= to_id was applied in this
process run. At start the row is empty at the position the run starts from; each advance of the
writer's position extends it (the replication handler only advances after applying every row in
between, fetching lost ones from the database); a jump that skipped rows would start a new row, and
the hole between rows is what the audit reports. Rows are written in autocommit, at most once per
`flush_interval_s` and only after a range changed, so the record may lag behind the worker but
never runs ahead of it.

What it cannot show: a bug in the handler that advanced past rows without applying them. The
history checker (workers.harness.history) covers that end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass

import asyncpg

from pubsub.tasks import cancel_and_wait
from pubsub.ticks import sleep_to_next_run

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Range:
    from_id: int
    to_id: int
    flushed_to: int


class AppliedRangesRecorder:
    def __init__(
        self, pool: asyncpg.Pool, worker_name: str, stream_name: str, *, flush_interval_s: float = 1.0
    ) -> None:
        self._pool = pool
        self.worker_name = worker_name
        self.stream_name = stream_name
        self.run_id = uuid.uuid4().hex
        self._flush_interval_s = flush_interval_s
        self._ranges: dict[str, _Range] = {}
        self._new: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        #: Set when a range changed: the task sleeps until then (a quiet worker writes nothing).
        self._changed = asyncio.Event()

    def begin(self, writer: str, position: int) -> None:
        """This run applies `writer`'s rows from `position` on (an empty range marks where it began)."""
        self._ranges[writer] = _Range(position, position, position)
        self._new.add(writer)
        self._changed.set()

    def advanced(self, writer: str, position: int) -> None:
        """Every row of `writer` up to `position` has been applied, in order."""
        current = self._ranges.get(writer)
        if current is None:
            self.begin(writer, position)
        elif position > current.to_id:
            current.to_id = position
            self._changed.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="applied-ranges")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            await self.flush()

    async def _run(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self.flush()
            except (OSError, asyncpg.PostgresError) as e:
                log.warning("could not record applied ranges (%s); will retry", e)
                self._changed.set()  # what was not written is still dirty
            await sleep_to_next_run(self._flush_interval_s)

    async def flush(self) -> None:
        now = int(time.time() * 1000)
        # A snapshot: `advanced` may move a range while the write is in flight, and what was not
        # written must stay dirty for the next flush.
        dirty = [
            (w, r, r.to_id) for w, r in self._ranges.items() if w in self._new or r.to_id != r.flushed_to
        ]
        if not dirty:
            return
        async with self._pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO replication_applied_ranges (worker_name, run_id, stream_name, instance_name,"
                " from_id, to_id, updated_ts) SELECT $1, $2, $3, w, f, t, $7"
                " FROM unnest($4::text[], $5::bigint[], $6::bigint[]) AS u(w, f, t)"
                " ON CONFLICT (worker_name, run_id, stream_name, instance_name, from_id)"
                " DO UPDATE SET to_id = EXCLUDED.to_id, updated_ts = EXCLUDED.updated_ts"
                " WHERE replication_applied_ranges.to_id < EXCLUDED.to_id",
                self.worker_name,
                self.run_id,
                self.stream_name,
                [w for w, _, _ in dirty],
                [r.from_id for _, r, _ in dirty],
                [to_id for _, _, to_id in dirty],
                now,
            )
        for writer, applied, to_id in dirty:
            applied.flushed_to = to_id
            self._new.discard(writer)
