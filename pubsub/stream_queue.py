"""One stream's serial queue on the reader: what was received, processed in order, one at a time.

`handler.py` checks and routes received lines; every RDATA and POSITION of a stream then goes
through its `StreamQueue`, so a catch-up never races live rows and a stream never processes two
commands at once. The queue is bounded: a full queue is emptied and the stream waits for the next
POSITION, which catches up from the database. See `handler.py` for the rules this applies.

Dependencies (`Stream.dependency_field`): before rows are applied, live or caught up, every other
writer a row names is brought up to the token it names, from the database, in this queue (the same
catch-up a POSITION whose prev is beyond what we know makes). It never waits for that writer: the
rows are in the database, and the one who named the token guarantees they are final.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from itertools import groupby
from time import monotonic
from typing import Any, Protocol

from pubsub.arrivals import Arrivals
from pubsub.errors import DependencyError
from pubsub.metrics import ReplicationMetrics
from pubsub.ratelog import RateLimitedLog
from pubsub.streams import ApplyCallback, Stream
from pubsub.ticks import TICK_S, sleep_to_next_run
from pubsub.types import PositionListener, Row
from pubsub.wire import Position

log = logging.getLogger(__name__)
MAX_BATCH_ROWS = 10_000
MAX_APPLY_ROWS = 1_000
#: The budget of sequence reads per stream (see `_within_bound`): this many a second on average, and
#: bursts of up to `BOUND_READ_BURST`. Within it no line waits for a timer.
BOUND_READS_PER_S = 200.0
BOUND_READ_BURST = 20.0
UNBOUNDED = 1 << 63

#: What a stream's queue holds, in arrival order (plain tuples: one is built and read per received
#: row). An RDATA line: (generation, writer, token, row, prev, count); token None is a `batch` row,
#: row None a row that failed validation (queued anyway: in order, it makes the writer wait for a
#: POSITION). A POSITION line: (generation, command).
Received = tuple[int, str, int | None, Row | None, int, int]
Announced = tuple[int, Position]


class QueueOwner(Protocol):
    """What a queue reads from the handler that owns it (current values, never copies)."""

    generation: int
    metrics: ReplicationMetrics
    queue_size: int
    catch_up_batch_size: int
    position_listeners: list[PositionListener]

    def reject(self, reason: str, detail: str) -> None: ...


class StreamQueue:
    """The reader's state of one stream and the task that processes its queue."""

    __slots__ = (
        "_apply_cb", "_bound", "_budget", "_budget_at", "_owner", "_ratelog", "_to_applied",
        "_to_woken", "announced", "arrivals", "connected", "last_heard", "pending", "positions_only",
        "queue", "stream", "task", "wake",
    )  # fmt: skip

    def __init__(
        self, stream: Stream[Any], owner: QueueOwner, apply: ApplyCallback, positions_only: bool = False
    ) -> None:
        self.stream = stream
        self.positions_only = positions_only
        self.queue: deque[Received | Announced] = deque()
        self.wake = asyncio.Event()
        self.connected: set[str] = set()
        self.pending: dict[str, list[Row]] = {}
        self.announced: dict[str, int] = {}
        self.last_heard: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None
        self.arrivals = Arrivals()
        self._to_applied, self._to_woken = owner.metrics.stages(stream.name)
        self._owner = owner
        self._apply_cb = apply
        self._ratelog = RateLimitedLog(log)
        self._bound = 0  # a token at or below it is one the database can show
        self._budget = BOUND_READ_BURST  # sequence reads that may start now
        self._budget_at = 0.0

    def follow(self, writer: str, token: int) -> None:
        """Queue `token` as `writer`'s position on a positions-only stream: merged into the last
        queued entry when that is this writer's on this connection (only the latest counts)."""
        queue, generation = self.queue, self._owner.generation
        if queue:
            last = queue[-1]
            if len(last) == 2 and last[0] == generation and last[1].instance == writer:
                if token > last[1].new_token:
                    queue[-1] = (generation, Position(self.stream.name, writer, token, token))
                return
        if len(queue) >= self._owner.queue_size:
            self.overflow()
        queue.append((generation, Position(self.stream.name, writer, token, token)))

    def overflow(self) -> None:
        count = len(self.queue)
        self.queue.clear()
        self.arrivals.dropped(count)
        self.connected.clear()
        self.pending.clear()
        self._owner.metrics.drop("backlog_overflow", count)
        self._ratelog.warning(
            f"overflow:{self.stream.name}",
            "replication backlog full: stream=%s dropped=%d; catching up from the database at next POSITION",
            self.stream.name,
            count,
        )

    def disconnect(self, writer: str) -> None:
        self.connected.discard(writer)
        self.pending.pop(writer, None)

    def received(self, at: float) -> None:
        """Everything queued so far and not yet marked was received at `at` (`monotonic()`)."""
        arrivals = self.arrivals
        marks, queued = arrivals.marks, arrivals.taken + len(self.queue)
        if not marks or marks[-1][0] < queued:  # `Arrivals.mark`, inline: once per socket read
            marks.append((queued, at))

    async def consume(self) -> None:
        arrivals = self.arrivals
        marks = arrivals.marks
        while True:
            if not self.queue:
                self.wake.clear()
                await self.wake.wait()
                continue
            entry = self.queue.popleft()
            arrivals.taken += 1
            if entry[0] != self._owner.generation:
                self._owner.metrics.drop("stale_connection")
                continue
            writer = entry[1] if len(entry) == 6 else entry[1].instance
            try:
                if len(entry) == 6:
                    await self._process_rdata(entry)
                else:
                    await self._process_position(entry[1], entry[0])
            except asyncio.CancelledError:
                raise
            except Exception:
                # Not advanced: the writer's next POSITION finds us behind and retries from the database.
                self.connected.discard(writer)
                self.pending.pop(writer, None)
                log.exception(
                    "replication processing failed: stream=%s instance=%s", self.stream.name, writer
                )
            if marks and marks[0][0] <= arrivals.taken:
                arrivals.prune()

    async def _process_rdata(self, entry: Received) -> None:
        _, writer, token, row, prev, count = entry
        first = self.arrivals.taken
        if writer not in self.connected:
            if row is not None:
                self._owner.metrics.drop("not_connected")
            return
        stream = self.stream
        if row is None:
            self.disconnect(writer)
            return
        if token is None:
            batch = self.pending.setdefault(writer, [])
            if len(batch) >= MAX_BATCH_ROWS:
                self._owner.reject("batch_too_long", f"stream={stream.name} instance={writer}")
                self.disconnect(writer)
                return
            batch.append(row)
            return
        batch = self.pending.pop(writer, [])
        rows = [*((token, r) for r in batch), (token, row)] if batch else [(token, row)]
        cur = stream.current_token(writer)
        if token <= cur:
            self._owner.metrics.drop("duplicate")
            return
        if prev > cur or count != len(rows):
            # A message of this writer was lost: wait for its next POSITION, which catches up.
            self._owner.metrics.drop("gap")
            self.disconnect(writer)
            return
        last = self._take_following(writer, token, rows)
        if last > self._bound and not await self._shown(writer, last, rows):
            self.disconnect(writer)  # its next POSITION (if real) catches up from the database
            return
        if last > self.announced.get(writer, 0):
            self.announced[writer] = last
        await self._apply(stream, writer, last, rows, first)

    def _take_following(self, writer: str, last: int, rows: list[tuple[int, Row]]) -> int:
        """Move the single-row tokens queued right behind token `last` of `writer` that continue
        its chain into `rows` (one apply, one advance and one wake-up for all: under load most
        tokens are single rows and arrive back to back); returns the last token taken.

        A queued line qualifies when it is the next numbered RDATA of the same writer on the same
        connection, valid, with one row and `prev` equal to the token before it; anything else
        (a POSITION, another writer, a `batch` row, a gap) ends the run and is processed as usual.
        """
        queue, generation = self.queue, self._owner.generation
        while queue and len(rows) < MAX_APPLY_ROWS:
            nxt = queue[0]
            if len(nxt) != 6:
                break  # a POSITION
            gen, instance, token, row, prev, count = nxt
            if (
                count != 1
                or prev != last
                or row is None
                or instance != writer
                or gen != generation
                or token is None
                or token <= last
            ):
                break
            queue.popleft()
            self.arrivals.taken += 1
            rows.append((token, row))
            last = token
        return last

    async def _process_position(self, cmd: Position, generation: int) -> None:
        writer, stream = cmd.instance, self.stream
        self.pending.pop(writer, None)
        if cmd.new_token > self._bound:
            if self.positions_only and stream.bounded and stream.known_bound() < cmd.new_token:
                await sleep_to_next_run(TICK_S)  # see `pubsub.handler`, positions only
            if not await self._within_bound(writer, cmd.new_token):
                return
        if cmd.new_token > self.announced.get(writer, 0):
            self.announced[writer] = cmd.new_token
        cur = stream.current_token(writer)
        if cur < cmd.prev_token and not self.positions_only:
            await self._catch_up(stream, writer, cur, cmd.new_token)
        if cmd.new_token > stream.current_token(writer):
            await self._apply(stream, writer, cmd.new_token, [])
        if generation == self._owner.generation:
            self.connected.add(writer)

    async def _catch_up(self, stream: Stream[Any], writer: str, cur: int, upto: int) -> None:
        """Apply `writer`'s rows in (cur, upto] from the database, in pages of bounded size."""
        limit = self._owner.catch_up_batch_size
        log.info("catching up: stream=%s instance=%s from=%d to=%d", stream.name, writer, cur, upto)
        while cur < upto:
            rows = await stream.fetch_updates(writer, cur, upto, limit)
            self._owner.metrics.catch_up_fetch(stream.name)
            if not rows:
                return
            limited = len(rows) >= limit
            if limited:
                last = rows[-1][0]
                complete = [r for r in rows if r[0] < last]
                if not complete:
                    limit *= 2  # one token holds a whole page: fetch it in one piece
                    continue
                rows = complete
                limit = self._owner.catch_up_batch_size
            self._owner.metrics.catch_up_fetched(stream.name, len(rows))
            for token, group in groupby(rows, key=lambda r: r[0]):
                await self._apply(stream, writer, token, list(group))
            cur = rows[-1][0]
            if not limited:
                return

    async def _apply(
        self, stream: Stream[Any], writer: str, token: int, rows: list[tuple[int, Any]], first: int = 0
    ) -> None:
        """Apply, advance, tell the listeners; live rows (`first`: the ordinal of the first queue
        entry they came in) are timed from their receipt, any rows from applied to listeners done."""
        if rows and (index := stream.dependency_index) is not None:
            for _, row in rows:  # nearly always none names one: no call, no allocation
                if row[index] is not None:
                    rows = await self._meet_dependencies(stream, writer, rows)
                    break
        if rows:
            await self._apply_cb(stream, writer, token, rows)
        stream.advance(writer, token)
        applied = monotonic() if rows else 0.0
        if first:
            arrivals = self.arrivals
            marks, taken = arrivals.marks, arrivals.taken
            if marks and marks[0][0] >= taken:  # one read brought them all: the usual case
                at = marks.popleft()[1] if marks[0][0] == taken else marks[0][1]
                self._to_applied.observe(applied - at, taken - first + 1)
            elif marks:
                arrivals.observe(first, taken, applied, self._to_applied)
        for listener in self._owner.position_listeners:
            try:
                result = listener(stream.name, writer, token)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("position listener failed: stream=%s instance=%s", stream.name, writer)
        if rows:
            self._to_woken.observe(monotonic() - applied)

    async def _meet_dependencies(
        self, stream: Stream[Any], writer: str, rows: list[tuple[int, Any]]
    ) -> list[tuple[int, Any]]:
        """Bring every other writer that `rows` name up to the token named (from the database), then
        return the rows still to apply (a nested dependency may have applied some of `writer`'s).
        A named writer this stream does not have is skipped (counted): its rows cannot be asked
        for. Raises `DependencyError` for a token beyond the stream's sequence."""
        needed = stream.dependencies(writer, rows)
        for other, upto in needed.items():
            cur = stream.current_token(other)
            if cur >= upto:
                continue
            if other not in stream.writers:
                self._owner.metrics.drop("dependency_unknown_writer")
                continue
            if upto > self._bound and not await self._within_bound(other, upto):
                raise DependencyError(
                    f"stream {stream.name}: a row of {writer} depends on {other} at {upto},"
                    " beyond the sequence"
                )
            self._owner.metrics.dependency_catch_up(stream.name)
            log.info(
                "catching up a dependency: stream=%s instance=%s from=%d to=%d before rows of %s",
                stream.name, other, cur, upto, writer,
            )  # fmt: skip
            await self._catch_up(stream, other, cur, upto)
            if stream.current_token(other) < upto:
                await self._apply(stream, other, upto, [])
        if needed and rows[0][0] <= (cur := stream.current_token(writer)):
            rows = [r for r in rows if r[0] > cur]
        return rows

    async def _shown(self, writer: str, token: int, rows: list[tuple[int, Row]]) -> bool:
        """`_within_bound` for the last of `rows`, unless the stream's witness (`Stream.witness`)
        finds that row stored at `token`: then the sequence reached it (only an ID handed out is
        ever written), and the read the witness makes for its own sake (the bodies a sync worker
        serves) stands for the sequence read. Within the same budget: a flood of forged lines
        cannot turn into a flood of reads of either kind. A row not found, or a read that fails,
        leaves it to the sequence."""
        witness = self.stream.witness
        if witness is None or self.stream.known_bound() >= token:
            return await self._within_bound(writer, token)
        found = witness(writer, rows)
        if found is None:
            return await self._within_bound(writer, token)
        wait = self._spend_budget()
        try:
            if wait > 0:
                await asyncio.sleep(wait)
            shown = await found
        except asyncio.CancelledError:
            if inspect.iscoroutine(found):
                found.close()  # cancelled before it ran: not awaited, never to be
            raise
        except Exception:  # the database decides through the sequence read, or says it is away
            shown = False
        if not shown:
            return await self._within_bound(writer, token)
        self._bound = max(self._bound, token)
        self._owner.metrics.witnessed(self.stream.name)
        return True

    async def _within_bound(self, writer: str, token: int) -> bool:
        """Whether `token`, above the cached bound, is one the database can show: at most the
        stream's sequence value (callers test `token > self._bound` first, without a call).

        No writer can have persisted past it, so a line claiming more is forged or corrupt, and
        following it would stall this reader (it would wait for rows that never come) or, on a
        writer, poison the position it announces. The bound is cached, and raised without I/O by
        what this process knows the sequence reached (its own allocations: on a busy writer most
        other writers' tokens are below them). A token still above reads the sequence at once: the
        queue is serial, so one read is in flight per stream, and it covers every line queued
        behind it. The reads are rate-limited by a budget (`BOUND_READS_PER_S`): only a line beyond
        it waits, so a flood of forged lines cannot turn into a flood of queries. A token still
        above the sequence is refused and counted, and the writer's next real line is taken as
        usual."""
        known = self.stream.known_bound()
        if known > self._bound:
            self._bound = known
            if token <= known:
                return True
        wait = self._spend_budget()
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            top = await self.stream.max_token()
        except Exception as e:  # the database is unreachable: nothing can show the token yet
            self._owner.metrics.drop("bound_unknown")
            self._ratelog.warning(
                f"bound:{self.stream.name}",
                "cannot read the sequence of stream=%s (%s): token %d of %s waits for its next line",
                self.stream.name, e, token, writer,
            )  # fmt: skip
            return False
        if top is None:  # nothing bounds this stream's tokens: never ask again
            self._bound = UNBOUNDED
            return True
        self._bound = max(self._bound, top)
        if token <= self._bound:
            return True
        self._owner.reject(
            "beyond_sequence",
            f"stream={self.stream.name} instance={writer} token={token} sequence={self._bound}",
        )
        return False

    def _spend_budget(self) -> float:
        """Take one sequence read from the budget; how long to wait first (0 within the budget)."""
        now = asyncio.get_running_loop().time()
        self._budget = min(BOUND_READ_BURST, self._budget + (now - self._budget_at) * BOUND_READS_PER_S) - 1
        self._budget_at = now
        return 0.0 if self._budget >= 0 else -self._budget / BOUND_READS_PER_S
