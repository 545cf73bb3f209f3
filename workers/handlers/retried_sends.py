"""Sends retried with their client transaction id, answered from the stored event before they take
a stream ID.

A send with a transaction id has an event id derived from it (`rooms.txn_event_id`), so the retry
of an answered send names a stored event. `RetryCheck` looks such sends up before they join the
persister's queue: one query for all that arrived meanwhile, one query in flight. A stored one is
answered with the stored row; the rest go on to the queue in arrival order. The lookup runs beside
the persister's batches, not on their serial ID allocation, so it adds a round trip to such a
send's latency and nothing to the persister's throughput (checking inside each batch, before its
IDs, cost a fifth of the throughput in a local A/B). The persister's unique-id backstop stays for a
retry that races its first try.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import asyncpg

from pubsub.tasks import cancel_and_wait
from workers.model import Event, NewEvent
from workers.storage.events import events_by_ids

log = logging.getLogger(__name__)
#: The longest a lookup may take before its sends are queued unchecked.
LOOKUP_TIMEOUT_S = 2.0

#: A queued event and the future its caller awaits.
Pending = tuple[NewEvent, "asyncio.Future[Event]"]


def answer_stored(pending: Iterable[Pending], stored: dict[str, Event]) -> list[Pending]:
    """Resolve the requests whose event is in `stored` with it; the rest, in order."""
    rest: list[Pending] = []
    for new, future in pending:
        event = stored.get(new.event_id)
        if event is None:
            rest.append((new, future))
        elif not future.done():
            future.set_result(event)
    return rest


class RetryCheck:
    """The lookup stage in front of a persister's queue (see the module docstring).

    `forward(rest)` queues what is not stored; `answered(n)` tells the persister that `n` of its
    requests were answered here."""

    def __init__(
        self, pool: asyncpg.Pool, forward: Callable[[list[Pending]], None], answered: Callable[[int], None]
    ) -> None:
        self._pool = pool
        self._forward = forward
        self._answered = answered
        #: Sends waiting for the next lookup (they count against the persister's queue bound).
        self.waiting: list[Pending] = []
        self._arrived: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        #: Retried sends answered from the stored event, and lookups that failed (the sends then
        #: went on to the queue, where the unique id still turns a retry into the stored event).
        self.answered = 0
        self.failed_lookups = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="persister-retry-check")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    def add(self, pending: Pending) -> None:
        self.waiting.append(pending)
        arrived = self._arrived
        if arrived is not None and not arrived.done():
            arrived.set_result(None)

    async def _run(self) -> None:
        while True:
            while not self.waiting:
                self._arrived = asyncio.get_running_loop().create_future()
                await self._arrived
            batch, self.waiting = self.waiting, []
            try:
                # Bounded: a lookup stuck on a broken link must not hold every later send.
                async with asyncio.timeout(LOOKUP_TIMEOUT_S), self._pool.acquire() as conn:
                    stored = await events_by_ids(conn, [new.event_id for new, _ in batch])
            except Exception as e:  # any failure: the queue's unique id still decides
                self.failed_lookups += 1
                log.warning(
                    "retry lookup failed sends=%d: %s: %s; queueing them unchecked",
                    len(batch),
                    type(e).__name__,
                    e,
                )
                stored = {}
            rest = answer_stored(batch, stored) if stored else batch
            if len(rest) < len(batch):
                self.answered += len(batch) - len(rest)
                self._answered(len(batch) - len(rest))
            if rest:
                self._forward(rest)
