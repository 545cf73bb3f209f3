"""The writer side: publish rows as RDATA in token order, and POSITION periodically.

Contract for the application (per write):

    async with generator.get_next() as token:
        ... persist the rows ...
        publisher.stage_rows(stream_name, [(token, row), ...])   # before the IDs are finished
    publisher.notify(stream_name)

Rows are staged before the ID is marked finished, so by the time `current_token(self)` passes
a token its rows are known here. A flush sends every staged token <= current_token(self), in
order, with `batch` on all rows but the last of a token, then a POSITION when the current token
is beyond the last row (IDs allocated by others, or unused).

Every `announce_interval_s` (a tick, on the shared clock of `pubsub.ticks`) a stream gets
`POSITION s self sent sent` when it sent rows since its last POSITION (so readers notice lost RDATA
within one interval) and, when idle, once every `keepalive_intervals` ticks: what tells readers the writer
is alive (they call it silent after `silent_writer_intervals`; the client keeps the keep-alive at
half of that). An idle writer whose own position moved because other writers moved
(`current_token(self)` follows them) announces it at the next tick like any move, so it never holds
readers' minimum back; repeating an unchanged position every second would tell a reader nothing
new. After a REPLICATE or our own (re)subscribe every stream gets its POSITION at once. Answers to
REPLICATE are coalesced: a burst (every worker restarting at once, or a flood) gets at most one
POSITION per stream every `REPLICATE_COALESCE_S`.

A failed publish is logged and counted, not retried: the rows are in the database and the next
POSITION (whose prev is beyond them) makes readers fetch them. Ticks also refresh the hint keys
for people and `fanout inspect`: a stream's positions-hash field when it moved, the heartbeat
(with TTL) at the keep-alive's cadence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from pubsub import keys
from pubsub.errors import LateRowsError, StreamConfigError
from pubsub.metrics import ReplicationMetrics
from pubsub.ratelog import RateLimitedLog
from pubsub.redis_transport import LINK_ERRORS
from pubsub.streams import Stream
from pubsub.tasks import cancel_and_wait
from pubsub.ticks import next_run
from pubsub.types import Row, Transport
from pubsub.wire import Position, format_command, format_numbered_rdata, format_rdata

log = logging.getLogger(__name__)
#: The shortest time between two answers to REPLICATE (each answer is a POSITION per stream).
REPLICATE_COALESCE_S = 0.1


#: A staged token whose rows may exist in the database but are unknown here (see `stage_unknown`).
_UNKNOWN = object()


class _Source:
    __slots__ = ("announced_upto", "channel", "hinted_upto", "last_line_at", "sent_upto", "staged", "stream")

    def __init__(self, stream: Stream[Any], channel: str, sent_upto: int) -> None:
        self.stream = stream
        self.channel = channel
        self.sent_upto = sent_upto
        #: The `new` token of the last POSITION sent, and when (loop time) the last line went.
        self.announced_upto = -1
        self.last_line_at = float("-inf")
        #: What the positions hash holds for us (None: not written by this process yet).
        self.hinted_upto: int | None = None
        #: token -> its row, or the list of its rows when it has several (rows are never lists).
        self.staged: dict[int, Row | str | list[Row | str]] = {}


class StreamPublisher:
    """Publishes the streams this instance writes; one per process."""

    def __init__(
        self,
        instance_name: str,
        streams: Sequence[Stream[Any]],
        transport: Transport,
        *,
        metrics: ReplicationMetrics,
        prefix: str,
        per_stream_channels: bool,
        announce_interval_s: float,
        heartbeat_ttl_s: float,
        keepalive_intervals: int = 1,
    ) -> None:
        self.instance_name = instance_name
        self.transport = transport
        self.metrics = metrics
        self.prefix = prefix
        self.announce_interval_s = announce_interval_s
        self.heartbeat_ttl_s = heartbeat_ttl_s
        # Half an interval early: ticks drift by a little, and a keep-alive due at a tick must not
        # wait for the next one.
        self._keepalive_s = (max(1, keepalive_intervals) - 0.5) * announce_interval_s
        self._keepalive_every_s = max(1, keepalive_intervals) * announce_interval_s
        self._beat_at = float("-inf")
        self._sources = {
            s.name: _Source(s, keys.stream_channel(prefix, s.name, per_stream_channels), 0) for s in streams
        }
        self._poke = asyncio.Event()
        self._announce_all = True
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._ratelog = RateLimitedLog(log)

    def start(self) -> None:
        for source in self._sources.values():
            source.sent_upto = source.stream.current_token(self.instance_name)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="repl-publisher")

    async def stop(self, grace_s: float = 5.0) -> None:
        """Let the loop finish the flush it is in (cancelling it mid-write would cost the connection
        and the rows staged for it), then stop it; cancel only after `grace_s`."""
        if self._task is None:
            return
        self._stopping = True
        self._poke.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), grace_s)
        await cancel_and_wait(self._task)
        self._task = None

    def stage_rows(self, stream: str, rows: Iterable[tuple[int, Row | str]]) -> None:
        """Remember (wire token, row) pairs for publishing, the rows of a token in order (one call
        may stage a whole batch); call before the IDs are finished. A row is an instance of the
        stream's row type or its JSON array text (see `Stream.encode_payload`)."""
        source = self._sources.get(stream)
        if source is None:
            raise StreamConfigError(f"{self.instance_name} does not write stream {stream!r}")
        staged, sent_upto = source.staged, source.sent_upto
        for token, row in rows:
            if token <= sent_upto:
                self.metrics.drop("late_rows")
                raise LateRowsError(
                    f"stream {stream}: token {token} already announced (sent up to {sent_upto}); "
                    "stage rows inside the ID's context, before it is finished"
                )
            earlier = staged.get(token)
            if earlier is None:
                staged[token] = row
            elif isinstance(earlier, list):
                earlier.append(row)
            else:
                staged[token] = [earlier, row]

    def stage_unknown(self, stream: str, token: int) -> None:
        """A write at `token` failed where its commit may still have happened (the connection
        broke at COMMIT): its rows, if any, are in the database only. Call inside the ID's block,
        like `stage_rows`. The announcements then skip over `token` as though its rows had been
        sent: the next RDATA or POSITION names a previous token readers never got, so each of
        them fetches that range from the database (a needless fetch when nothing was written)."""
        source = self._sources.get(stream)
        if source is None:
            raise StreamConfigError(f"{self.instance_name} does not write stream {stream!r}")
        if token > source.sent_upto and token not in source.staged:
            source.staged[token] = _UNKNOWN  # type: ignore[assignment]

    def notify(self, stream: str | None = None) -> None:
        """New IDs finished: flush soon (coalesced)."""
        self._poke.set()

    def request_announce_all(self) -> None:
        """Someone sent REPLICATE, or we (re)subscribed: announce every stream's position (and
        write every hint again at the next tick: a Redis that restarted has lost them)."""
        self._announce_all = True
        self._beat_at = float("-inf")
        for source in self._sources.values():
            source.hinted_upto = None
        self._poke.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        last_all = -REPLICATE_COALESCE_S
        while not self._stopping:
            due = next_tick
            if self._announce_all:  # a burst of REPLICATEs: at most one answer per interval
                due = min(due, last_all + REPLICATE_COALESCE_S)
            if not self._poke.is_set():
                # Not wait_for: it wraps the wait in a task of its own on every flush.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(due):
                        await self._poke.wait()
            self._poke.clear()
            if self._stopping:
                return
            now = loop.time()
            tick = now >= next_tick
            announce = self._announce_all and now >= last_all + REPLICATE_COALESCE_S
            if announce:
                self._announce_all = False
                last_all = now
            if tick:  # a process writing no stream has only its heartbeat to keep
                next_tick = next_run(
                    loop.time(), self.announce_interval_s if self._sources else self._keepalive_every_s
                )
            await self.flush(announce=announce, keepalive=tick)
            if tick:
                await self._write_hints(now)

    def _due(self, source: _Source, now: float) -> bool:
        """At a tick: whether `source` owes readers a POSITION though it did not move (rows went
        out since its last POSITION, or its keep-alive is due)."""
        return source.sent_upto > source.announced_upto or now - source.last_line_at >= self._keepalive_s

    def _build_lines(self, source: _Source, announce: bool, now: float) -> list[tuple[str, str]]:
        stream, me, channel = source.stream, self.instance_name, source.channel
        name, encode = stream.name, stream.encode_payload
        current = stream.current_token(me)
        lines: list[tuple[str, str]] = []
        prev = source.sent_upto
        staged = source.staged
        skipped = False  # the last token taken was an unknown one: tell readers at once
        if current > prev and staged:
            if max(staged) <= current:  # the usual case: every staged ID has finished
                ready = sorted(staged)
                taken = [staged[token] for token in ready]
                staged.clear()
            else:
                ready = sorted(t for t in staged if t <= current)
                taken = [staged.pop(token) for token in ready]
            last = prev
            for token, rows in zip(ready, taken, strict=True):
                skipped = rows is _UNKNOWN
                if skipped:
                    last = token  # as if sent: the next line's previous token makes readers fetch it
                    continue
                if isinstance(rows, list):
                    for row in rows[:-1]:
                        lines.append((channel, format_rdata(name, me, None, encode(row))))
                    lines.append((channel, format_rdata(name, me, token, encode(rows[-1], last, len(rows)))))
                else:  # one row, usually given as JSON text: one call builds its line
                    line = format_numbered_rdata(name, me, token, last, rows) if type(rows) is str else None
                    lines.append((channel, line or format_rdata(name, me, token, encode(rows, last, 1))))
                last = token
            if ready:
                prev = ready[-1]
            self.metrics.command_out("RDATA", name, len(lines))
        if current > prev or announce or skipped:
            new = max(current, prev)
            lines.append((channel, format_command(Position(name, me, prev, new))))
            self.metrics.command_out("POSITION", name)
            source.announced_upto = new
        if lines:
            source.last_line_at = now
        source.sent_upto = max(current, source.sent_upto)
        return lines

    async def flush(self, *, announce: bool = False, keepalive: bool = False) -> None:
        """Publish what is ready on every stream, and a POSITION for each stream when `announce`,
        for each stream that owes one (see the module docstring) when `keepalive`."""
        lines: list[tuple[str, str]] = []
        now = asyncio.get_running_loop().time()
        for source in self._sources.values():
            force = announce or (keepalive and self._due(source, now))
            lines.extend(self._build_lines(source, force, now))
        if not lines:
            return
        try:
            await self.transport.publish_many(lines)
        except LINK_ERRORS as e:
            self.metrics.publish_errors += 1
            self._ratelog.warning(
                "publish", "publish failed (%s): %d lines lost; readers will catch up", e, len(lines)
            )

    async def _write_hints(self, now: float) -> None:
        """Positions hash and heartbeat key: for people and tools, never the source of truth. A
        field is written when its position moved, the heartbeat at the keep-alive's cadence (well
        inside its TTL); nothing at all at most ticks of an idle writer."""
        moved = [s for s in self._sources.values() if s.hinted_upto != s.sent_upto]
        beat_due = now - self._beat_at >= self._keepalive_s
        if not moved and not beat_due:
            return
        written = [(source, source.sent_upto) for source in moved]
        commands: list[tuple[str, ...]] = [
            ("HSET", keys.positions_key(self.prefix, source.stream.name), self.instance_name, str(upto))
            for source, upto in written
        ]
        if beat_due:
            beat = {"ts": round(time.time(), 3), "streams": sorted(self._sources)}
            ttl_ms = str(max(1, int(self.heartbeat_ttl_s * 1000)))
            beat_key = keys.heartbeat_key(self.prefix, self.instance_name)
            commands.append(("SET", beat_key, json.dumps(beat), "PX", ttl_ms))
        try:
            await self.transport.write_keys(commands)
        except LINK_ERRORS as e:
            self._ratelog.warning("hints", "could not refresh position hints (%s)", e)
            return
        for source, upto in written:
            source.hinted_upto = upto
        if beat_due:
            self._beat_at = now

    def positions(self) -> dict[str, int]:
        """What has been announced per stream (the writer's view)."""
        return {name: source.sent_upto for name, source in self._sources.items()}
