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
* A row may name another writer's `(writer, token)` it depends on (`Stream.dependency_field`, a
  trailing row field, so the grammar and older readers are unchanged): before it is applied, live
  or caught up, that writer is brought up to the token from the database, in the stream's queue
  (`StreamQueue`); already covered, nothing happens (no query). A token beyond the sequence is
  refused like any forged token, and the row's writer waits for its next POSITION.
* Rejected input (bad line, forged writer, invalid row) is logged (rate-limited), counted by
  reason and never moves a position. A row of a known stream may carry trailing fields this
  release does not know: they are ignored (`pubsub.streams`). A line of a stream this process does
  not know is a newer release's during a rolling upgrade, not a forgery: skipped and counted as
  dropped (`unknown_stream`), logged at INFO (rate-limited).
* A line under our own name is never applied. An own POSITION is parsed in full first (a token
  above 2**63 - 1 is refused as malformed, like anyone's); only a well-formed one claiming a
  position beyond our commits is the alarm of `_check_own_claim`.
* A stream can be followed for positions only (`positions_only`): for a process that applies none
  of its rows (a persister that serves no reads) but must know how far every writer got (its
  persisted-upto, and the position it announces when idle). A numbered RDATA's token and a
  POSITION's new token then only advance the writer (RDATA is published up to the writer's
  position, so its token is one); rows are neither validated nor applied and there is no
  catch-up. Queued positions of one writer in a row are merged into one. A forged line can do no
  more here than a forged POSITION can on a full reader: only a configured writer's name is heard.
  Nothing waits on these positions but the process's own announcement, made at its ticks, so a
  position above the stream's cached bound waits for the shared clock's next tick
  (`pubsub.ticks`) before the sequence is read: one read a second covers every line heard
  meanwhile, where each line's read was a wake-up and a round trip of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from time import monotonic
from typing import Any

from pydantic import ValidationError

from pubsub.errors import WireError
from pubsub.metrics import ReplicationMetrics
from pubsub.ratelog import RateLimitedLog
from pubsub.stream_queue import Announced, Received, StreamQueue
from pubsub.streams import ApplyCallback, StreamRegistry
from pubsub.tasks import cancel_and_wait
from pubsub.types import PositionListener, Row
from pubsub.wire import (
    NAME_PATTERN,
    ClearUserSync,
    Command,
    Position,
    RData,
    Replicate,
    UserSync,
    command_name,
    own_line_prefixes,
    parse_line,
    split_numbered_rdata,
)

log = logging.getLogger(__name__)
UserSyncListener = Callable[[UserSync | ClearUserSync], Awaitable[None] | None]


#: Where `handle_lines` sends another writer's RDATA: its stream's queue, the writer, the stream's
#: numbered-payload validator (None: the stream is followed for positions only), row type and the
#: end of the row's fields in the validated values (later ones are a newer release's, ignored).
_Route = tuple[StreamQueue, str, Callable[[str | bytes], tuple[Any, ...]] | None, type[Row], int]


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
        #: Called with (stream, instance) for each line of an instance this process does not take
        #: as a writer of the stream (during a change of `stream_writers`, workers disagree).
        self.foreign_writer_listeners: list[Callable[[str, str], None]] = []
        self.user_sync_listeners: list[UserSyncListener] = []
        self.on_replicate: Callable[[], None] | None = None
        followed = frozenset(positions_only)
        unknown = followed - {s.name for s in streams}
        if unknown:
            raise ValueError(f"positions_only names streams that are not read: {sorted(unknown)}")
        self._states = {s.name: StreamQueue(s, self, apply, s.name in followed) for s in streams}
        # Our own lines come back when one channel carries everything: recognised by prefix,
        # before any parsing (a writer hears every row it sends).
        self._echo_prefixes = own_line_prefixes(instance_name, self._states)
        self._own_prefixes = self._echo_prefixes + own_line_prefixes(instance_name, self._other_streams)
        # (stream, writer) of every other writer of a read stream, as bytes: `handle_lines` checks
        # and queues their RDATA inline.
        self._rdata_routes: dict[tuple[bytes, bytes], _Route] = self._routes()
        metrics.gauge_source = self._gauge_values
        self._background: set[asyncio.Task[None]] = set()
        self._ratelog = RateLimitedLog(log)
        self._started_at = 0.0

    def _routes(self) -> dict[tuple[bytes, bytes], _Route]:
        return {
            (name.encode(), writer.encode()): (
                state,
                writer,
                None if state.positions_only else state.stream.validate_numbered,
                state.stream.row_type,
                2 + state.stream.width,
            )
            for name, state in self._states.items()
            for writer in state.stream.writers
            if writer != self.instance_name and NAME_PATTERN.fullmatch(writer)
        }

    def set_writers(self, stream: str, writers: Iterable[str]) -> None:
        """The writers of a read `stream` changed (a config reload): lines of an added writer are
        accepted from now on (its RDATA waits for its first POSITION, as after a reconnect), a
        removed writer's are refused. The stream's generator is the caller's to update."""
        state = self._states[stream]
        state.stream.writers = frozenset(writers)
        if self._started_at:
            for writer in state.stream.writers:
                state.last_heard.setdefault(writer, asyncio.get_running_loop().time())
        self._rdata_routes = self._routes()

    def settle(self, stream: str, writer: str, token: int) -> None:
        """`writer` writes `stream` no more (its name is fenced) and got no ID above `token`:
        apply its rows up to `token` from the database, as its POSITION there would make us."""
        state = self._states[stream]
        state.queue.append((self.generation, Position(stream, writer, token, token)))
        state.wake.set()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._started_at = loop.time()
        for state in self._states.values():
            for writer in state.stream.writers:
                state.last_heard.setdefault(writer, self._started_at)
            if state.task is None:
                state.task = loop.create_task(state.consume(), name=f"repl-{state.stream.name}")

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

    def reject(self, reason: str, detail: str) -> None:
        """Count and log (rate-limited) a refused line; nothing else happens."""
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
        split = split_numbered_rdata
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
                    if data.startswith(b"POSITION "):
                        self._own_position(data)
                    else:
                        echoes += 1
                else:
                    unsubscribed += 1
                size += len(data)
                continue
            fields = split(data, max_bytes)  # the checks `parse_line` would make, on the bytes
            if fields is not None and (route := routes.get((fields[0], fields[1]))) is not None:
                token, payload = fields[2], fields[3]
                state, writer, validate, row_type, end = route
                if validate is None:
                    if route is not follow:
                        if follow is not None:
                            follow[0].follow(follow[1], top)
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
                        state.overflow()
                        self.metrics.drop("backlog_overflow")
                    else:
                        row = new(row_type, values[2:end])
                        state.queue.append((generation, writer, int(token), row, values[0], values[1]))
                size += len(data)
                if route is not last:
                    if last is not None:
                        runs.append((last, run))
                    last, run = route, 0
                run += 1
                continue
            if follow is not None:
                follow[0].follow(follow[1], top)
                follow = None
            self.handle_line(data, now)
        if follow is not None:
            follow[0].follow(follow[1], top)
        self.metrics.bytes_in += size
        if echoes:
            self.metrics.drop("echo", echoes)
        if unsubscribed:
            self.metrics.drop("not_subscribed", unsubscribed)
        if last is not None:
            runs.append((last, run))
        received = monotonic() if runs else 0.0
        for (state, writer, *_), count in runs:
            state.received(received)
            state.last_heard[writer] = now
            self.metrics.command_in("RDATA", state.stream.name, count)
            state.wake.set()

    def _own_position(self, data: bytes) -> None:
        """A POSITION under our own name: never applied (our positions come from our own commits).
        It is parsed in full first, so a malformed one (a token above 2**63 - 1 included) is
        rejected with its reason like anyone's, and only a well-formed one reaches the own-name
        check. (Only POSITION lines are parsed: they come once per interval, while parsing every
        echoed row would cost the write path a parse per row.)"""
        try:
            cmd = parse_line(data, self.max_line_bytes)
        except WireError as e:
            self.reject(e.reason, f"detail={e.detail!r} line={bytes(data[:80])!r}")
            return
        self.metrics.drop("echo")
        if isinstance(cmd, Position):
            self._check_own_claim(cmd.stream, cmd.new_token)

    def _check_own_claim(self, stream: str, token: int) -> None:
        """An own POSITION that claims a position we never reached means another process speaks
        under our name (or forges it): count it and raise an alarm (rate-limited), nothing else."""
        state = self._states.get(stream)
        if state is None or token <= state.stream.current_token(self.instance_name):
            return
        self.metrics.reject("conflicting_own_name")
        self._ratelog.error(
            f"own:{stream}",
            "ALARM: a line under this instance's own name claims %s position %d, beyond what it committed"
            " (%d): another process uses the name %s, or someone forges it; ignored",
            stream,
            token,
            state.stream.current_token(self.instance_name),
            self.instance_name,
        )

    def handle_line(self, data: bytes | str, now: float) -> None:
        """Validate one received line and route it; never raises."""
        self.metrics.bytes_in += len(data)
        if isinstance(data, bytes):
            if data.startswith(self._own_prefixes):
                if data.startswith(self._echo_prefixes):
                    if data.startswith(b"POSITION "):
                        self._own_position(data)
                    else:
                        self.metrics.drop("echo")
                else:
                    self.metrics.drop("not_subscribed")
                return
        try:
            cmd = parse_line(data, self.max_line_bytes)
        except WireError as e:
            self.reject(
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
                self.metrics.drop("unknown_stream")
                self._ratelog.log(
                    logging.INFO,
                    "unknown_stream",
                    "skipped replication line of unknown stream=%s instance=%s (a newer release's?)",
                    stream_name,
                    instance,
                )
            return
        if instance == self.instance_name:
            self.metrics.drop("echo")
            return
        if instance not in state.stream.writers:
            self.reject("not_a_writer", f"stream={stream_name} instance={instance}")
            for listener in self.foreign_writer_listeners:
                listener(stream_name, instance)
            return
        if state.positions_only:
            token = cmd.token if isinstance(cmd, RData) else cmd.new_token
            self.metrics.command_in(command_name(cmd), stream_name)
            state.last_heard[instance] = now
            if token is not None:  # a `batch` row says nothing of the position
                state.follow(instance, token)
                state.wake.set()
            return
        entry: Received | Announced
        if type(cmd) is RData:
            row: Row | None = None
            prev = count = 0
            try:
                row, prev, count = state.stream.parse_payload(cmd.row_json, cmd.token is not None)
            except ValidationError as e:
                self.reject("invalid_row", f"stream={stream_name} instance={instance} error={e.errors()[:1]}")
            entry = (self.generation, instance, cmd.token, row, prev, count)
        else:
            assert type(cmd) is Position
            entry = (self.generation, cmd)
        self.metrics.command_in(command_name(cmd), stream_name)
        state.last_heard[instance] = now
        if len(state.queue) >= self.queue_size:
            state.overflow()
            if isinstance(cmd, RData):
                self.metrics.drop("backlog_overflow")
                return
        state.queue.append(entry)
        state.received(monotonic())
        state.wake.set()

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
