"""The reader side: turn received lines into applied rows, in order, exactly once.

Rules (see the package docstring for why):
* RDATA and POSITION of one stream go through one bounded serial queue, so a catch-up never races
  live rows. A full queue is emptied and the stream waits for the next POSITION, which catches up
  from the database: memory stays bounded and nothing is lost.
* Each connection has a generation. `connection_lost()` starts a new one: queued commands of an
  older generation are dropped, and until a writer's first POSITION on the new connection has been
  processed, that writer's RDATA is dropped (the POSITION's catch-up covers it).
* POSITION prev..new: when what we know of the writer (`cur`) is below `prev`, rows were lost:
  fetch (cur, new] through the stream's update function, page by page, apply them in order,
  then move to `new`. When `cur` is above `new` the writer restarted: nothing to fetch.
* RDATA with a token at or below `cur` is a duplicate and ignored. `batch` rows wait for the
  numbered row of the same writer and are applied together with it. The numbered row names the
  writer's previous announced token and the row count of its token (`Stream.encode_payload`):
  when `prev` is beyond `cur` or rows are missing, a message was lost, so the rows are not
  applied and the writer waits for its next POSITION (at most one announce interval away).
* Order contract: `apply(stream, instance, token, rows)` (the application invalidates caches
  there), then the generator is advanced to `token`, then position listeners run (they wake
  readers). `rows` are every row of one or more consecutive tokens of `instance`, up to and
  including `token`, in order: single-row tokens queued back to back are applied together.
  If `apply` raises, the generator is not advanced and the writer waits for the next POSITION,
  whose catch-up retries the rows.
* Rejected input (bad line, unknown stream, forged writer, invalid row) is logged (rate-limited),
  counted by reason and never moves a position.
* A stream can be followed for positions only (`positions_only`): for a process that applies none
  of its rows (a persister that serves no reads) but must know how far every writer got (its
  persisted-upto, and the position it announces when idle). A numbered RDATA's token and a
  POSITION's new token then only advance the writer (RDATA is published up to the writer's
  position, so its token is one); rows are neither validated nor applied and there is no
  catch-up. Queued positions of one writer in a row are merged into one. A forged line can do no
  more here than a forged POSITION can on a full reader: only a configured writer's name is heard.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from itertools import groupby
from typing import Any

from pydantic import ValidationError

from pubsub.errors import WireError
from pubsub.metrics import ReplicationMetrics
from pubsub.ratelog import RateLimitedLog
from pubsub.streams import Stream, StreamRegistry
from pubsub.tasks import cancel_and_wait
from pubsub.types import ApplyCallback, PositionListener, Row
from pubsub.wire import (
    MAX_TOKEN_DIGITS,
    NAME_PATTERN,
    ClearUserSync,
    Command,
    Position,
    RData,
    Replicate,
    UserSync,
    command_name,
    parse_line,
)

log = logging.getLogger(__name__)
MAX_BATCH_ROWS = 10_000
MAX_APPLY_ROWS = 1_000
UserSyncListener = Callable[[UserSync | ClearUserSync], Awaitable[None] | None]


#: What a stream's queue holds, in arrival order (plain tuples: one is built and read per received
#: row). An RDATA line: (generation, writer, token, row, prev, count); token None is a `batch` row,
#: row None a row that failed validation (queued anyway: in order, it makes the writer wait for a
#: POSITION). A POSITION line: (generation, command).
_Received = tuple[int, str, int | None, Row | None, int, int]
_Announced = tuple[int, Position]
#: Where `handle_lines` sends another writer's RDATA: its stream's state, the writer, the stream's
#: numbered-payload validator (None: the stream is followed for positions only) and row type.
_Route = tuple["_StreamState", str, Callable[[str | bytes], tuple[Any, ...]] | None, type[Row]]


class _StreamState:
    __slots__ = (
        "announced", "connected", "last_heard", "pending", "positions_only", "queue", "stream", "task",
        "wake",
    )  # fmt: skip

    def __init__(self, stream: Stream[Any], positions_only: bool = False) -> None:
        self.stream = stream
        self.positions_only = positions_only
        self.queue: deque[_Received | _Announced] = deque()
        self.wake = asyncio.Event()
        self.connected: set[str] = set()
        self.pending: dict[str, list[Row]] = {}
        self.announced: dict[str, int] = {}
        self.last_heard: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None


class ReplicationHandler:
    """Receives lines (`handle_lines`, `handle_line`), validates and routes them, applies rows
    through `apply`."""

    def __init__(
        self,
        instance_name: str,
        streams: StreamRegistry,
        apply: ApplyCallback,
        *,
        metrics: ReplicationMetrics,
        other_streams: Iterable[str] = (),
        positions_only: Iterable[str] = (),
        max_line_bytes: int = 1 << 20,
        catch_up_batch_size: int = 1000,
        queue_size: int = 10_000,
    ) -> None:
        self.instance_name = instance_name
        self.streams = streams
        self._apply_cb = apply
        self.metrics = metrics
        self._other_streams = frozenset(other_streams)
        self.max_line_bytes = max_line_bytes
        self.catch_up_batch_size = catch_up_batch_size
        self.queue_size = queue_size
        self.generation = 0
        self.position_listeners: list[PositionListener] = []
        self.user_sync_listeners: list[UserSyncListener] = []
        self.on_replicate: Callable[[], None] | None = None
        followed = frozenset(positions_only)
        unknown = followed - {s.name for s in streams}
        if unknown:
            raise ValueError(f"positions_only names streams that are not read: {sorted(unknown)}")
        self._states = {s.name: _StreamState(s, s.name in followed) for s in streams}
        # Our own lines come back when one channel carries everything: recognised by prefix,
        # before any parsing (a writer hears every row it sends).
        self._echo_prefixes = _own_prefixes(instance_name, self._states)
        self._own_prefixes = self._echo_prefixes + _own_prefixes(instance_name, self._other_streams)
        # (stream, writer) of every other writer of a read stream, as bytes: `handle_lines` checks
        # and queues their RDATA inline.
        self._rdata_routes: dict[tuple[bytes, bytes], _Route] = {
            (name.encode(), writer.encode()): (
                state,
                writer,
                None if state.positions_only else state.stream.validate_numbered,
                state.stream.row_type,
            )
            for name, state in self._states.items()
            for writer in state.stream.writers
            if writer != instance_name and NAME_PATTERN.fullmatch(writer)
        }
        metrics.gauge_source = self._gauge_values
        self._background: set[asyncio.Task[None]] = set()
        self._ratelog = RateLimitedLog(log)
        self._started_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._started_at = loop.time()
        for state in self._states.values():
            for writer in state.stream.writers:
                state.last_heard.setdefault(writer, self._started_at)
            if state.task is None:
                state.task = loop.create_task(self._consume(state), name=f"repl-{state.stream.name}")

    async def stop(self) -> None:
        tasks = [s.task for s in self._states.values() if s.task is not None]
        tasks += list(self._background)
        await cancel_and_wait(*tasks)
        for state in self._states.values():
            state.task = None

    def connection_lost(self) -> None:
        """The subscription is gone (or was silently renewed): every stream waits for a POSITION."""
        self.generation += 1
        for state in self._states.values():
            state.connected.clear()
            state.pending.clear()

    # -- receive path (synchronous: never blocks the socket reader) ----------------------------

    def _reject(self, reason: str, detail: str) -> None:
        self.metrics.reject(reason)
        self._ratelog.warning(reason, "rejected replication line: reason=%s %s", reason, detail)

    def handle_lines(self, lines: Iterable[bytes], now: float) -> None:
        """Validate and route the lines of one socket read, in order; never raises.

        Most lines are our own (on a shared channel a writer hears every row it sends) or a
        numbered RDATA of another writer of a stream we read. Both are handled here on the bytes,
        without a Python call per line: our own are counted and dropped by prefix; an RDATA whose
        stream and writer are a known route gets exactly the checks `parse_line` and
        `_route_stream_command` would make (size, UTF-8, no line breaks, canonical token, the
        stream's strict row validator) and is queued; on a positions-only stream, only its token is
        taken (no row validation). Every other line, and any line that fails one of those checks
        (or is not ASCII), goes through `handle_line`, which parses it in full and, if it is bad,
        rejects it with its reason.
        """
        own, echo, routes, new = self._own_prefixes, self._echo_prefixes, self._rdata_routes, tuple.__new__
        max_bytes, generation, queue_size = self.max_line_bytes, self.generation, self.queue_size
        echoes = unsubscribed = size = run = 0
        runs: list[tuple[_Route, int]] = []  # (route, lines queued through it in a row)
        last: _Route | None = None
        # A positions-only route's highest token so far, queued (`_follow`) when another such route
        # or the full path comes next: one queue entry per run, as per-line calls would merge.
        follow: _Route | None = None
        top = 0
        for data in lines:
            if data.startswith(own):
                if data.startswith(echo):
                    echoes += 1
                else:
                    unsubscribed += 1
                size += len(data)
                continue
            parts = data.split(b" ", 4)
            route = routes.get((parts[1], parts[2])) if len(parts) == 5 and parts[0] == b"RDATA" else None
            if route is not None:
                token, payload = parts[3], parts[4]
                if (
                    len(data) <= max_bytes
                    and token.isdigit()
                    and (token[0] != 48 or len(token) == 1)  # 48: "0"
                    and len(token) <= MAX_TOKEN_DIGITS
                    and payload[:1] == b"["
                    and 10 not in data  # "\n"; an int: `b"\n" in` costs bytes a caught TypeError
                    and 13 not in data  # "\r"
                    and data.isascii()  # so UTF-8; other lines are rare: `handle_line` decodes them
                ):
                    state, writer, validate, row_type = route
                    if validate is None:
                        if route is not follow:
                            if follow is not None:
                                self._follow(follow[0], follow[1], top)
                            follow, top = route, 0
                        if int(token) > top:
                            top = int(token)
                    else:  # another stream's queue: a pending run of `follow` may wait
                        try:
                            values = validate(payload)  # `Stream.parse_payload`, without its call
                        except ValidationError:
                            self.handle_line(data, now)  # rejects it with the validator's message
                            continue
                        if len(state.queue) >= queue_size:
                            self._overflow(state)
                            self.metrics.drop("backlog_overflow")
                        else:
                            row = new(row_type, values[2:])
                            state.queue.append((generation, writer, int(token), row, values[0], values[1]))
                    size += len(data)
                    if route is not last:
                        if last is not None:
                            runs.append((last, run))
                        last, run = route, 0
                    run += 1
                    continue
            if follow is not None:
                self._follow(follow[0], follow[1], top)
                follow = None
            self.handle_line(data, now)
        if follow is not None:
            self._follow(follow[0], follow[1], top)
        self.metrics.bytes_in += size
        if echoes:
            self.metrics.drop("echo", echoes)
        if unsubscribed:
            self.metrics.drop("not_subscribed", unsubscribed)
        if last is not None:
            runs.append((last, run))
        for (state, writer, *_), count in runs:
            state.last_heard[writer] = now
            self.metrics.command_in("RDATA", state.stream.name, count)
            state.wake.set()

    def handle_line(self, data: bytes | str, now: float) -> None:
        """Validate one received line and route it; never raises."""
        self.metrics.bytes_in += len(data)
        if isinstance(data, bytes):
            if data.startswith(self._own_prefixes):
                self.metrics.drop("echo" if data.startswith(self._echo_prefixes) else "not_subscribed")
                return
        try:
            cmd = parse_line(data, self.max_line_bytes)
        except WireError as e:
            self._reject(
                e.reason,
                f"detail={e.detail!r} line={bytes(data[:80]) if isinstance(data, bytes) else data[:80]!r}",
            )
            return
        if isinstance(cmd, (RData, Position)):
            self._route_stream_command(cmd, now)
        else:
            self._route_other(cmd)

    def _route_stream_command(self, cmd: RData | Position, now: float) -> None:
        stream_name, instance = cmd.stream, cmd.instance
        state = self._states.get(stream_name)
        if state is None:
            if stream_name in self._other_streams:
                self.metrics.drop("not_subscribed")
            else:
                self._reject("unknown_stream", f"stream={stream_name}")
            return
        if instance == self.instance_name:
            self.metrics.drop("echo")
            return
        if instance not in state.stream.writers:
            self._reject("not_a_writer", f"stream={stream_name} instance={instance}")
            return
        if state.positions_only:
            token = cmd.token if isinstance(cmd, RData) else cmd.new_token
            self.metrics.command_in(command_name(cmd), stream_name)
            state.last_heard[instance] = now
            if token is not None:  # a `batch` row says nothing of the position
                self._follow(state, instance, token)
                state.wake.set()
            return
        entry: _Received | _Announced
        if type(cmd) is RData:
            row: Row | None = None
            prev = count = 0
            try:
                row, prev, count = state.stream.parse_payload(cmd.row_json, cmd.token is not None)
            except ValidationError as e:
                self._reject(
                    "invalid_row", f"stream={stream_name} instance={instance} error={e.errors()[:1]}"
                )
            entry = (self.generation, instance, cmd.token, row, prev, count)
        else:
            assert type(cmd) is Position
            entry = (self.generation, cmd)
        self.metrics.command_in(command_name(cmd), stream_name)
        state.last_heard[instance] = now
        if len(state.queue) >= self.queue_size:
            self._overflow(state)
            if isinstance(cmd, RData):
                self.metrics.drop("backlog_overflow")
                return
        state.queue.append(entry)
        state.wake.set()

    def _follow(self, state: _StreamState, writer: str, token: int) -> None:
        """Queue `token` as `writer`'s position on a positions-only stream: merged into the last
        queued entry when that is this writer's on this connection (only the latest counts)."""
        queue, generation = state.queue, self.generation
        if queue:
            last = queue[-1]
            if len(last) == 2 and last[0] == generation and last[1].instance == writer:
                if token > last[1].new_token:
                    queue[-1] = (generation, Position(state.stream.name, writer, token, token))
                return
        if len(queue) >= self.queue_size:
            self._overflow(state)
        queue.append((generation, Position(state.stream.name, writer, token, token)))

    def _overflow(self, state: _StreamState) -> None:
        count = len(state.queue)
        state.queue.clear()
        state.connected.clear()
        state.pending.clear()
        self.metrics.drop("backlog_overflow", count)
        self._ratelog.warning(
            f"overflow:{state.stream.name}",
            "replication backlog full: stream=%s dropped=%d; catching up from the database at next POSITION",
            state.stream.name,
            count,
        )

    def _route_other(self, cmd: Command) -> None:
        self.metrics.command_in(command_name(cmd), "")
        if isinstance(cmd, Replicate):
            if self.on_replicate is not None:
                self.on_replicate()
            return
        assert isinstance(cmd, UserSync | ClearUserSync)
        for listener in self.user_sync_listeners:
            result = listener(cmd)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self._background.add(task)
                task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Future[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("user-sync listener failed", exc_info=task.exception())

    # -- per-stream serial processing ----------------------------------------------------------

    async def _consume(self, state: _StreamState) -> None:
        while True:
            if not state.queue:
                state.wake.clear()
                await state.wake.wait()
                continue
            entry = state.queue.popleft()
            if entry[0] != self.generation:
                self.metrics.drop("stale_connection")
                continue
            writer = entry[1] if len(entry) == 6 else entry[1].instance
            try:
                if len(entry) == 6:
                    await self._process_rdata(state, entry)
                else:
                    await self._process_position(state, entry[1], entry[0])
            except asyncio.CancelledError:
                raise
            except Exception:
                # Not advanced: the writer's next POSITION finds us behind and retries from the database.
                state.connected.discard(writer)
                state.pending.pop(writer, None)
                log.exception(
                    "replication processing failed: stream=%s instance=%s", state.stream.name, writer
                )

    async def _process_rdata(self, state: _StreamState, entry: _Received) -> None:
        _, writer, token, row, prev, count = entry
        if writer not in state.connected:
            if row is not None:
                self.metrics.drop("not_connected")
            return
        stream = state.stream
        if row is None:
            self._disconnect(state, writer)
            return
        if token is None:
            batch = state.pending.setdefault(writer, [])
            if len(batch) >= MAX_BATCH_ROWS:
                self._reject("batch_too_long", f"stream={stream.name} instance={writer}")
                self._disconnect(state, writer)
                return
            batch.append(row)
            return
        batch = state.pending.pop(writer, [])
        rows = [*batch, row] if batch else [row]
        if token > state.announced.get(writer, 0):
            state.announced[writer] = token
        cur = stream.current_token(writer)
        if token <= cur:
            self.metrics.drop("duplicate")
            return
        if prev > cur or count != len(rows):
            # A message of this writer was lost: wait for its next POSITION, which catches up.
            self.metrics.drop("gap")
            self._disconnect(state, writer)
            return
        await self._apply(stream, writer, self._take_following(state, writer, token, rows), rows)

    def _take_following(self, state: _StreamState, writer: str, last: int, rows: list[Row]) -> int:
        """Move the single-row tokens queued right behind token `last` of `writer` that continue
        its chain into `rows` (one apply, one advance and one wake-up for all: under load most
        tokens are single rows and arrive back to back); returns the last token taken.

        A queued line qualifies when it is the next numbered RDATA of the same writer on the same
        connection, valid, with one row and `prev` equal to the token before it; anything else
        (a POSITION, another writer, a `batch` row, a gap) ends the run and is processed as usual.
        """
        queue, generation = state.queue, self.generation
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
            rows.append(row)
            last = token
        if last > state.announced.get(writer, 0):
            state.announced[writer] = last
        return last

    def _disconnect(self, state: _StreamState, writer: str) -> None:
        state.connected.discard(writer)
        state.pending.pop(writer, None)

    async def _process_position(self, state: _StreamState, cmd: Position, generation: int) -> None:
        writer, stream = cmd.instance, state.stream
        state.pending.pop(writer, None)
        if cmd.new_token > state.announced.get(writer, 0):
            state.announced[writer] = cmd.new_token
        cur = stream.current_token(writer)
        if cur < cmd.prev_token and not state.positions_only:
            await self._catch_up(stream, writer, cur, cmd.new_token)
        if cmd.new_token > stream.current_token(writer):
            await self._apply(stream, writer, cmd.new_token, [])
        if generation == self.generation:
            state.connected.add(writer)

    async def _catch_up(self, stream: Stream[Any], writer: str, cur: int, upto: int) -> None:
        """Apply `writer`'s rows in (cur, upto] from the database, in pages of bounded size."""
        limit = self.catch_up_batch_size
        log.info("catching up: stream=%s instance=%s from=%d to=%d", stream.name, writer, cur, upto)
        while cur < upto:
            rows = await stream.fetch_updates(writer, cur, upto, limit)
            self.metrics.catch_up_fetch(stream.name)
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
                limit = self.catch_up_batch_size
            self.metrics.catch_up_fetched(stream.name, len(rows))
            for token, group in groupby(rows, key=lambda r: r[0]):
                await self._apply(stream, writer, token, [row for _t, row in group])
            cur = rows[-1][0]
            if not limited:
                return

    async def _apply(self, stream: Stream[Any], writer: str, token: int, rows: list[Any]) -> None:
        if rows:
            await self._apply_cb(stream, writer, token, rows)
        stream.advance(writer, token)
        for listener in self.position_listeners:
            try:
                result = listener(stream.name, writer, token)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("position listener failed: stream=%s instance=%s", stream.name, writer)

    def _gauge_values(self) -> list[tuple[str, str, int, int]]:
        """(stream, writer, applied position, announced minus applied), read when metrics are scraped."""
        out = []
        for name, state in self._states.items():
            for writer in sorted(state.stream.writers):
                if writer == self.instance_name:
                    continue
                cur = state.stream.current_token(writer)
                out.append((name, writer, cur, max(0, state.announced.get(writer, cur) - cur)))
        return out

    # -- health --------------------------------------------------------------------------------

    def silent_writers(self, now: float, silent_after_s: float) -> list[tuple[str, str, float]]:
        """(stream, writer, seconds since heard) of configured writers not heard for `silent_after_s`."""
        result = []
        for state in self._states.values():
            for writer in sorted(state.stream.writers):
                if writer == self.instance_name:
                    continue
                quiet = now - state.last_heard.get(writer, self._started_at)
                silent = quiet > silent_after_s
                self.metrics.silent[(state.stream.name, writer)] = 1 if silent else 0
                if silent:
                    result.append((state.stream.name, writer, quiet))
        return result

    def stream_status(self, now: float) -> dict[str, dict[str, dict[str, Any]]]:
        """Per stream and writer: applied position, announced position, connected, seconds since heard."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name, state in self._states.items():
            out[name] = {
                writer: {
                    "position": state.stream.current_token(writer),
                    "announced": state.announced.get(writer),
                    "connected": writer in state.connected,
                    "heard_s_ago": round(now - state.last_heard.get(writer, self._started_at), 3),
                    "queued": len(state.queue),
                }
                for writer in sorted(state.stream.writers)
                if writer != self.instance_name
            }
        return out

    def is_connected(self, stream: str, writer: str) -> bool:
        return writer in self._states[stream].connected


def _own_prefixes(instance: str, streams: Iterable[str]) -> tuple[bytes, ...]:
    """The byte prefixes of `instance`'s RDATA and POSITION lines on `streams`."""
    return tuple(
        f"{command} {stream} {instance} ".encode()
        for stream in sorted(streams)
        for command in ("RDATA", "POSITION")
    )
