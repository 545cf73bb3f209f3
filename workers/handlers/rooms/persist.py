"""The event persister: batches concurrent sends into one transaction.

Requests queue up; the loop takes everything queued (up to `max_batch`) as one batch: one
`get_next_mult` per stream, one multi-row insert per table, one commit. So under load a persister
costs a few round trips per batch, not per event.

Up to `max_in_flight` batches are in the database at once: while one waits on its insert, the next
is allocated and sent, so the writer's CPU is not idle during round trips. Allocation stays
serial (a batch asks for its IDs only once the previous batch has its own), so events get stream
orderings in arrival order, and events of one room keep their order. Batches may commit out of
order; the ID generator then holds the writer's position below the unfinished one, and the
publisher sends RDATA only up to that position, in token order.

A batch written in one statement (a few messages) takes the next batch from the queue when its
own IDs arrive, and that statement allocates the next batch's IDs too (`idgen.Ride`): under load
a batch then costs one round trip, not two. The next batch is allocated only once this one has
its IDs, as above, and starts once the statement returned; if the statement failed, the next
batch goes back to the head of the queue and allocates on its own (IDs the failed statement may
have taken are harmless gaps: nothing was written with them).

Order on the writer, for every batch:
1. commit the rows (events, current state, membership, the caches log);
2. `on_committed`: the worker invalidates its own caches and stages the rows for RDATA (the
   events' row JSON is built with their stored JSON, `Event.json_texts`);
3. leave the ID generators' blocks: the IDs count as finished, `stream_positions` is upserted;
4. `on_finished`: publish RDATA and wake local readers;
5. resolve the callers' futures.
With a `fence` (the instance lease's) and `room_leases`, every batch checks, inside what commits
it, that this process still holds its name (`Fence.check`) and each room of the batch
(`RoomLeases.check`): a process that lost its name or a room commits nothing more there. A batch
of a few messages is one statement, its insert guarded by that check (`RoomLeases.guard`: one
round trip); any other runs in a transaction whose last statement before COMMIT is the check.
A send with a client transaction id (`persist(..., may_exist=True)`) is looked up in its batch's
ID allocation (`idgen.Probe`, the same statement as `nextval`): a retry of an answered send takes
no stream ID, so no follower sees a gap to catch up on, and is answered with the stored event.
A failed transaction fails every request of the batch (their IDs become harmless gaps). When the
connection was lost at COMMIT, the batch may have committed all the same: inside the ID blocks,
the persister ends the old backend and looks for the batch's rows
(`workers.storage.commit_outcome`), then goes on as committed (the callers get their events) or as
failed (a 503 for them). Only when that is interrupted (shutdown) does the outcome stay unknown:
`on_uncertain` runs inside the ID blocks, so the worker can make readers fetch those IDs from the
database and forget what it cached.

Over 500 lines: the queue, the batches in flight, the ride that hands one batch's IDs to the next
and the commit-outcome paths share the persister's state, and their interleavings (a failed
statement sending the next batch back, a batch isolated in halves) read best in one place.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import asyncpg

from idgen import MultiWriterIdGenerator, Probe, Ride
from idgen.multi_writer import DATABASE_DOWN
from pubsub.tasks import cancel_and_wait
from workers.errors import PersisterError, PersisterStopped
from workers.handlers.placement.room_leases import RoomLeases
from workers.handlers.rooms.retried_sends import Pending, answer_stored
from workers.handlers.rooms.versions import RoomVersions
from workers.model import CREATE_EVENT, CacheInvalidation, Event, NewEvent, StateChanges, room_version_of
from workers.process.instance_lease import Fence, LeaseLost
from workers.storage.commit_outcome import BACKEND_PID_SQL, committed, outcome_unknown, row_exists
from workers.storage.events import (
    INSERT_MAX_ROWS,
    Guard,
    event_rows,
    event_rows_statement,
    events_by_ids,
    insert_batch,
    needs_transaction,
)
from workers.storage.named_pool import NamedPool
from workers.streams.events import with_after

log = logging.getLogger(__name__)
#: Events per batch at most: past this, bigger batches stopped paying off in `fanout bench cluster`.
MAX_BATCH = 500
#: Loop turns a batch written in one statement gives sends to queue (one always, more while none
#: is queued), before it takes the next batch and sends its statement with that batch's
#: allocation. At 16 closed-loop senders on two persisters, 3 turns took the share of batches
#: allocated in the statement before them from a quarter to a half; a turn costs a few
#: microseconds and no wait on I/O.
RIDE_WAIT_TURNS = 3

#: (events, their `events` stream rows as JSON, caches rows with their stream ids) of one batch.
BatchCallback = Callable[
    [Sequence[Event], Sequence[str], Sequence[tuple[int, CacheInvalidation]]], Awaitable[None] | None
]


class PersisterOverloaded(PersisterError):
    """The queue is full: the client should retry later (HTTP 503)."""


def guard_rooms(events: Sequence[Event]) -> list[str]:
    """The rooms of a batch, once each, in order."""
    return list(dict.fromkeys(e.room_id for e in events))


#: (events, caches stream ids) of a batch that failed where its commit may still have happened.
UncertainCallback = Callable[[Sequence[Event], Sequence[int]], None]


class EventPersister:
    """Persists live events (positive stream) or backfilled events (negative stream)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        instance_name: str,
        events_gen: MultiWriterIdGenerator,
        caches_gen: MultiWriterIdGenerator | None,
        *,
        on_committed: BatchCallback,
        on_finished: BatchCallback,
        backfill: bool = False,
        room_versions: RoomVersions | None = None,
        on_uncertain: UncertainCallback | None = None,
        max_batch: int = MAX_BATCH,
        max_queue: int = 20_000,
        max_in_flight: int = 2,
        fence: Fence | None = None,
        room_leases: RoomLeases | None = None,
    ) -> None:
        self._pool = pool
        #: Behind a transaction pooler every batch is a transaction that reads its backend's pid.
        self._pooled = isinstance(pool, NamedPool) and pool.transaction_pooler
        self._fence = fence
        self._room_leases = room_leases
        self._instance = instance_name
        self._events_gen = events_gen
        self._caches_gen = caches_gen
        self._on_committed = on_committed
        self._on_finished = on_finished
        self._backfill = backfill
        self._versions = room_versions
        self._on_uncertain = on_uncertain
        self._max_batch = max_batch
        self._slots = asyncio.Semaphore(max_in_flight)
        self._in_flight: set[asyncio.Task[None]] = set()
        self._max_queue = max_queue
        # A deque and wake-up futures rather than asyncio.Queue and Events: their per-item
        # bookkeeping showed in write path profiles. `_arrived` is the future the loop last waited
        # on for work; `_drained` is made by `stop`, resolved when `_unfinished` (queued and
        # in-flight events) reaches 0.
        self._queue: collections.deque[Pending] = collections.deque()
        self._arrived: asyncio.Future[None] | None = None
        self._unfinished = 0
        self._drained: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: The next batch, taken from the queue by the batch before it, with the IDs that batch's
        #: statement allocated for it (`_ride_next`); `_run` starts it before anything queued.
        self._ridden: tuple[list[Pending], Ride] | None = None
        #: The next batch while the current one's statement carries its ride (`_follow` settles it).
        self._following: tuple[list[Pending], Ride] | None = None
        #: Batches whose IDs were allocated in the statement of the batch before them.
        self.rides = 0
        #: Ids of queued events that may be stored already (a client transaction id): looked up
        #: in their batch's allocation.
        self._maybe_stored: set[str] = set()
        #: Sends answered with their stored event (retries of answered sends).
        self.retries_answered = 0
        self.batches = 0
        self.events = 0
        self.failed_batches = 0
        #: Batches PostgreSQL refused and that were persisted again in halves.
        self.isolations = 0
        #: Batches whose COMMIT answer was lost and that turned out committed.
        self.late_commits = 0
        #: Batches whose commit outcome stayed unknown (interrupted while finding out).
        self.unknown_outcomes = 0

    def start(self) -> None:
        self._task = asyncio.create_task(
            self._run(), name=f"persister-{'backfill' if self._backfill else 'live'}"
        )

    def persist(self, event: NewEvent, *, may_exist: bool = False) -> asyncio.Future[Event]:
        """Queue `event`; the future gives it persisted, with its stream ordering, once its batch
        finished. (A future rather than a coroutine: one frame less per event on the write path.)
        `may_exist`: the event id comes from a client transaction id, so the send may be a retry of
        one already stored: it is looked up in its batch's allocation and, if stored, answered with
        the stored event. Raises PersisterStopped or PersisterOverloaded at once."""
        queue = self._queue
        if self._stopping or len(queue) >= self._max_queue:
            self._check_room(1)  # raises
        future: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._unfinished += 1
        if may_exist:
            self._maybe_stored.add(event.event_id)
        queue.append((event, future))
        arrived = self._arrived
        if arrived is not None and not arrived.done():
            arrived.set_result(None)
        return future

    async def persist_many(self, events: Sequence[NewEvent]) -> list[Event]:
        """Queue `events` back to back, so they get increasing stream orderings in this order."""
        self._check_room(len(events))
        create_future = asyncio.get_running_loop().create_future
        futures: list[asyncio.Future[Event]] = [create_future() for _ in events]
        self._queue.extend(zip(events, futures, strict=True))
        self._queued(len(events))
        return list(await asyncio.gather(*futures))

    def _maybe_drained(self) -> None:
        if not self._unfinished and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _check_room(self, count: int) -> None:
        if self._stopping:
            raise PersisterStopped("this worker is shutting down")
        queued = len(self._queue)
        if queued + count > self._max_queue:
            raise PersisterOverloaded(f"{queued} events queued")

    def _queued(self, count: int) -> None:
        self._unfinished += count
        arrived = self._arrived
        if arrived is not None and not arrived.done():
            arrived.set_result(None)

    async def stop(self) -> None:
        """Take no new events, finish everything queued, then stop the loop."""
        self._stopping = True
        if self._unfinished:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            # Take the slot first: while all batches are in the database, arrivals keep queueing
            # and the next batch grows.
            await self._slots.acquire()
            ridden, self._ridden = self._ridden, None
            if ridden is None:
                while not self._queue:
                    self._arrived = asyncio.get_running_loop().create_future()
                    await self._arrived
                # One turn of the loop lets every sender that is ready enqueue: batches grow with load.
                await asyncio.sleep(0)
                queue = self._queue
                batch = [queue.popleft() for _ in range(min(len(queue), self._max_batch))]
                ride = None
            else:
                batch, ride = ridden
            allocated = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(self._run_batch(batch, allocated, ride))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            await allocated

    async def _run_batch(
        self, batch: list[Pending], allocated: asyncio.Future[None], ride: Ride | None = None
    ) -> None:
        try:
            stored = await self._persist_batch(batch, allocated, ride, may_ride=not self._backfill)
            if stored:
                self.retries_answered += len(stored)
                rest = await self._answer_existing(stored)
                if rest:  # gone since the allocation looked: persist them after all
                    self._queue.extendleft(reversed(rest))
                    self._queued(len(rest))
        except asyncpg.UniqueViolationError as e:
            # A retried send whose event exists (its id comes from the client's transaction id).
            # Rare: answer those with the stored event and queue the rest again, first in line.
            rest = await self._answer_existing(batch)
            if len(rest) == len(batch):
                await self._isolate(batch, e)
            elif rest:
                self._queue.extendleft(reversed(rest))
                self._queued(len(rest))
        except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as e:
            await self._isolate(batch, e)
        except Exception as e:
            self._fail(batch, e)
        finally:
            if not allocated.done():
                # Only the batch whose allocation is pending can hold a following batch.
                self._follow()
                allocated.set_result(None)
            if ride is not None:
                await ride.discard()  # failed before it used its IDs: they stay gaps
            self._slots.release()
            self._unfinished -= len(batch)
            self._maybe_drained()

    async def _isolate(self, batch: list[Pending], error: Exception) -> None:
        """PostgreSQL refused the batch's data: persist it again in halves, in order, so that only
        the requests it refuses fail (the HTTP edge refuses what it knows PostgreSQL would; this is
        the fallback for the rest). A half gets new IDs; the failed attempt's are harmless gaps."""
        if len(batch) == 1:
            if isinstance(error, asyncpg.UniqueViolationError):
                batch = await self._answer_existing(batch)
            self._fail(batch, error)
            return
        self.isolations += 1
        log.warning("batch of %d refused (%s); persisting it in halves", len(batch), error)
        middle = len(batch) // 2
        for half in (batch[:middle], batch[middle:]):
            allocated: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            try:
                await self._persist_batch(half, allocated)
            except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as e:
                await self._isolate(half, e)
            except Exception as e:
                self._fail(half, e)

    def _fail(self, batch: list[Pending], error: Exception) -> None:
        if not batch:
            return
        self.failed_batches += 1
        if isinstance(error, LeaseLost):
            log.error("batch failed events=%d: %s", len(batch), error)
        elif isinstance(error, DATABASE_DOWN):  # expected: the client gets a 503
            kind = type(error).__name__
            log.warning("batch failed events=%d, database unavailable: %s: %s", len(batch), kind, error)
        else:
            log.error("batch failed events=%d: %s", len(batch), error, exc_info=error)
        for _, future in batch:
            if not future.done():
                future.set_exception(error)

    async def _answer_existing(self, batch: list[Pending]) -> list[Pending]:
        """Resolve the requests whose event id is already stored with the stored event; the rest."""
        async with self._pool.acquire() as conn:
            stored = await events_by_ids(conn, [new.event_id for new, _ in batch])
        return answer_stored(batch, stored)

    async def _persist_batch(
        self,
        batch: list[Pending],
        allocated: asyncio.Future[None],
        ride: Ride | None = None,
        *,
        may_ride: bool = False,
    ) -> list[Pending]:
        """Persist `batch`; the requests its allocation found stored (to answer with those events).
        With `ride`, its IDs come from the batch before it (`_ride_next`). With `may_ride`, when the
        batch is written in one statement, that statement allocates the next batch's IDs too."""
        now = int(time.time() * 1000)
        changes = StateChanges()
        if not self._backfill:
            for new, _ in batch:
                if new.state_key is not None:
                    changes.add(new)
        invalidation_rows = changes.invalidations(now)
        versions = await self._room_versions(batch)
        maybe = [new.event_id for new, _ in batch if new.event_id in self._maybe_stored]
        self._maybe_stored.difference_update(maybe)
        stored_already: list[Pending] = []
        async with contextlib.AsyncExitStack() as stack:
            allocation = ride or self._events_gen.get_next_mult(
                len(batch), probe=Probe("events", "event_id", maybe) if maybe else None
            )
            ids = await stack.enter_async_context(allocation)
            if allocation.found:
                stored_already = [p for p in batch if p[0].event_id in allocation.found]
                batch = [p for p in batch if p[0].event_id not in allocation.found]
                if not batch:
                    allocated.set_result(None)
                    return stored_already
            cache_ids: list[int] = []
            if invalidation_rows and self._caches_gen is not None:
                cache_ids = await stack.enter_async_context(
                    self._caches_gen.get_next_mult(len(invalidation_rows))
                )
            me = self._instance
            events = [new.persisted(i, me, now) for i, (new, _) in zip(ids, batch, strict=True)]
            invalidations = list(zip(cache_ids, invalidation_rows, strict=False))
            guard = self._guard(events, invalidations)
            one_insert = guard is not None or not (
                self._fence is not None
                or self._room_leases is not None
                or self._pooled
                or needs_transaction(events, invalidations)
            )
            # The next batch is allocated only once this one has its IDs (here, or in this batch's
            # statement), so stream orderings follow the queue's order.
            rides = may_ride and one_insert and len(events) <= INSERT_MAX_ROWS
            if rides:
                # Sends whose request was read meanwhile queue up, as before `_run` takes a batch.
                await asyncio.sleep(0)
                for _ in range(RIDE_WAIT_TURNS - 1):
                    if self._queue:
                        break
                    await asyncio.sleep(0)
            following = self._ride_next() if rides else None
            if following is None:
                allocated.set_result(None)
            stored, rows = zip(
                *[event.json_texts(versions.get(event.room_id)) for event in events], strict=True
            )
            if self._room_leases is not None and self._room_leases.any_taken and not self._backfill:
                rows = self._after_handovers(events, rows)
            pid = 0
            committing = False
            try:
                async with self._pool.acquire() as conn:
                    pid = conn.get_server_pid()
                    if following is not None:
                        committing = True  # one statement: it commits as it runs
                        sql, args = event_rows_statement(event_rows(events, stored), guard)
                        try:
                            written = await following.carry(conn, sql, args)
                        finally:
                            self._follow()
                            allocated.set_result(None)
                        if not written:
                            assert self._room_leases is not None
                            raise await self._room_leases.why_not_held(conn, guard_rooms(events), self._fence)
                    elif guard is not None:
                        committing = True  # one statement: it commits as it runs
                        sql, args = event_rows_statement(event_rows(events, stored), guard)
                        if await conn.execute(sql, *args) == "INSERT 0 0":
                            assert self._room_leases is not None
                            raise await self._room_leases.why_not_held(conn, guard_rooms(events), self._fence)
                    elif self._fence is not None or self._room_leases is not None:
                        async with conn.transaction():
                            if self._pooled:  # the backend is the pooler's pick: ask it
                                pid = await conn.fetchval(BACKEND_PID_SQL)
                            await insert_batch(conn, events, stored, invalidations, me)
                            # Last: they hold the lease rows only until COMMIT.
                            if self._room_leases is not None:
                                rooms = {e.room_id for e in events}
                                await self._room_leases.check(conn, rooms, self._fence)
                            elif self._fence is not None:
                                await self._fence.check(conn)
                            committing = True
                    elif self._pooled or needs_transaction(events, invalidations):
                        async with conn.transaction():
                            if self._pooled:  # the backend is the pooler's pick: ask it
                                pid = await conn.fetchval(BACKEND_PID_SQL)
                            await insert_batch(conn, events, stored, invalidations, me)
                            committing = True  # leaving the block sends COMMIT
                    else:
                        committing = True  # one statement: it commits as it runs
                        await insert_batch(conn, events, stored, invalidations, me)
            except BaseException as e:
                if not (committing and await self._committed_after_all(e, pid, events, cache_ids)):
                    raise
            result = self._on_committed(events, rows, invalidations)
            if result is not None:
                await result
        # The IDs are finished and stream_positions upserted: now others may learn of them.
        result = self._on_finished(events, rows, invalidations)
        if result is not None:
            await result
        self.batches += 1
        self.events += len(events)
        for (_, future), event in zip(batch, events, strict=True):
            if not future.done():
                future.set_result(event)
        return stored_already

    def _ride_next(self) -> Ride | None:
        """The `Ride` of the next batch (its IDs and its retry lookup) for the current batch's
        statement to carry, that batch taken from the queue now (held in `_following`); None
        when nothing is queued."""
        queue = self._queue
        if not queue:
            return None
        batch = [queue.popleft() for _ in range(min(len(queue), self._max_batch))]
        maybe = [new.event_id for new, _ in batch if new.event_id in self._maybe_stored]
        probe = Probe("events", "event_id", maybe) if maybe else None
        ride = self._events_gen.ride_mult(len(batch), probe=probe)
        self._following = (batch, ride)
        return ride

    def _follow(self) -> None:
        """Once the statement that was to carry the next batch's ride returned or failed (or the
        batch failed before it): that batch goes next, with its IDs, or back to the head of the
        queue when it has none."""
        following, self._following = self._following, None
        if following is None:
            return
        batch, ride = following
        if ride.carried:
            self._ridden = following
            self.rides += 1
        else:
            self._queue.extendleft(reversed(batch))

    def _after_handovers(self, events: Sequence[Event], rows: Sequence[str]) -> tuple[str, ...]:
        """The rows, those of rooms taken from another writer with what they depend on
        (`RoomLeases.after`: readers apply the old writer's rows up to there first)."""
        assert self._room_leases is not None
        after = self._room_leases.after
        return tuple(
            row if (moved := after(event.room_id)) is None else with_after(event, row, moved)
            for event, row in zip(events, rows, strict=True)
        )

    def _guard(self, events: Sequence[Event], invalidations: Sequence[object]) -> Guard | None:
        """The room leases' check as a condition of the batch's one statement, when the batch is
        one statement (a few messages, no state, no invalidation) on a direct connection (through
        a pooler the commit-outcome lookup needs the backend named in a transaction)."""
        leases = self._room_leases
        if (
            leases is None
            or self._pooled
            or len(events) > INSERT_MAX_ROWS
            or needs_transaction(events, invalidations)
        ):
            return None
        return leases.guard(guard_rooms(events), self._fence)

    async def _committed_after_all(
        self, error: BaseException, pid: int, events: Sequence[Event], cache_ids: Sequence[int]
    ) -> bool:
        """The batch failed at its commit (inside the ID blocks): whether it committed after all.

        When the answer to COMMIT was lost, learn the outcome from the database
        (`commit_outcome.committed`) before the IDs finish. Cancelled meanwhile (or at COMMIT), the
        outcome stays unknown: `on_uncertain` makes readers fetch the batch's IDs from the database
        and the worker forget what the batch may have changed."""
        if not isinstance(error, Exception):  # cancelled (shutdown): no time to find out
            self._uncertain(events, cache_ids)
            return False
        if not outcome_unknown(error):
            return False  # PostgreSQL answered: rolled back
        try:
            probe = row_exists("events", "stream_ordering", events[0].stream_ordering)
            if await committed(self._pool, pid, probe, f"a batch of {len(events)} events"):
                self.late_commits += 1
                return True
            return False
        except BaseException:
            self._uncertain(events, cache_ids)
            raise

    def _uncertain(self, events: Sequence[Event], cache_ids: Sequence[int]) -> None:
        self.unknown_outcomes += 1
        if self._on_uncertain is not None:
            self._on_uncertain(events, cache_ids)

    async def _room_versions(self, batch: list[Pending]) -> dict[str, str]:
        """The version of each room of the batch (a new room's from its create event), for the rows."""
        if self._versions is None:
            return {}
        for new, _ in batch:
            if new.type == CREATE_EVENT and new.state_key == "":
                self._versions.learn(new.room_id, room_version_of(new.content))
        known = await self._versions.of_rooms(new.room_id for new, _ in batch)
        return {room_id: version.identifier for room_id, version in known.items()}

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def unfinished(self) -> int:
        """Events queued or in a batch that has not ended (committed, failed or found out)."""
        return self._unfinished

    @property
    def batches_in_flight(self) -> int:
        return len(self._in_flight)
