"""A stand-in for a federation sender: it consumes what local writers queue for remote servers.

The cluster speaks no federation. What a federation sender would send is still queued by the
writers: device-list pokes (`device_lists_outbound_pokes`) and to-device messages for remote users
(`device_federation_outbox`). This task, run by the instance that lists `federation_sender` in
`background_tasks`, takes them oldest first in bounded batches, records the pokes as sent (the
newest stream id per server and user, in `device_lists_outbound_sent`) and deletes what it took,
so neither table grows without bound. Counted in `fanout_federation_stand_in_sent_total`.

A writer queues an item in the transaction that writes its stream row (device lists or to-device),
so nothing new can be queued while those streams' positions stand still: the task reads the
queues only when `queued()` (a stamp of those positions) changed since its last drain, and every
`SWEEP_S` whatever it says (a row this worker's positions cannot show: one queued while it was
down is taken by the first drain at start).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry, Counter

from idgen.multi_writer import DATABASE_ERRORS
from pubsub.tasks import cancel_and_wait
from pubsub.ticks import sleep_to_next_run
from workers.storage import device_lists as pokes
from workers.storage import to_device as outbox

log = logging.getLogger(__name__)
TASK_NAME = "federation_sender"
#: The longest the queues go unread, positions still or not.
SWEEP_S = 30.0


class FederationSenderStandIn:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        registry: CollectorRegistry,
        queued: Callable[[], object],
        *,
        batch: int = 500,
        interval_s: float = 0.5,
        sweep_s: float = SWEEP_S,
    ) -> None:
        self._pool = pool
        self._queued = queued
        self._batch = batch
        self._interval_s = interval_s
        self._sweep_s = sweep_s
        self._drained_at: tuple[object, float] | None = None
        self._task: asyncio.Task[None] | None = None
        self.sent = Counter(
            "fanout_federation_stand_in_sent",
            "Items the stand-in federation sender consumed, by kind (device-list pokes, to-device)",
            ["kind"],
            registry=registry,
        )

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=TASK_NAME)

    async def drain_once(self) -> tuple[int, int]:
        """Consume everything queued now: (pokes, to-device messages for servers)."""
        taken_pokes = taken_messages = 0
        while True:
            async with self._pool.acquire() as conn, conn.transaction():
                found = len(await pokes.take_pokes(conn, self._batch))
            taken_pokes += found
            if found < self._batch:
                break
        while True:
            async with self._pool.acquire() as conn:
                found = len(await outbox.take_outbox(conn, self._batch))
            taken_messages += found
            if found < self._batch:
                break
        self.sent.labels("device_list_poke").inc(taken_pokes)
        self.sent.labels("to_device").inc(taken_messages)
        return taken_pokes, taken_messages

    async def drain_if_queued(self) -> bool:
        """`drain_once` when something may have been queued since the last drain (or the sweep is
        due); whether it drained."""
        stamp, now = self._queued(), asyncio.get_running_loop().time()
        last = self._drained_at
        if last is not None and stamp == last[0] and now - last[1] < self._sweep_s:
            return False
        await self.drain_once()
        self._drained_at = (stamp, now)  # taken before the drain: what commits during it is seen next
        return True

    async def _run(self) -> None:
        while True:
            try:
                await self.drain_if_queued()
            except DATABASE_ERRORS as e:
                log.warning("federation sender stand-in: %s; retrying", e)
            await sleep_to_next_run(self._interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
