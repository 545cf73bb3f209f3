"""A worker's configuration read again on SIGHUP: the writers and the instance map change online.

Only `stream_writers` and `instance_map` change while a worker runs. Another setting changed in the
file is named in one warning line and keeps its value until a restart (the writers still change);
so do `stream_writers.typing` and `.presence`, whose one writer keeps its state in memory. A file
that does not load or validate changes nothing (one line, `fanout_config_reloads_total{outcome=
"refused"}`), and neither does one that would make this worker a writer of a stream it does not
write now: a worker takes on a stream's writes only at start.

What a running worker does with a new writer list (`LiveWriters.apply`):
* Routing follows at once: rooms (`RoomPlacement`, a learned holder that left is forgotten), the
  user-keyed stored streams (`UserStreamWrites`), worker requests (`instance_map`). Reads need
  no list: a token names every writer ahead of its `stream`, current or retired.
* Replication: an added writer's lines are accepted from now on and it counts at today's
  persisted-upto until it is heard (it has allocated nothing yet: every worker must know a writer
  before it writes). A removed writer stays counted, and its lines accepted, while it may still
  write; once its instance name is free (it stopped or crashed), this worker fences the name
  (`instance_lease.fence_out`: that process can commit nothing more), applies its rows up to the
  sequence's end from the database, and only then stops counting it, so a removed writer never
  holds the stream's minimum back and no position passes what it persisted.
* Rooms: a persister no longer in the events writers stops taking rooms, finishes its queued
  writes, and releases every room (the SIGTERM path); it then writes nothing and says it should be
  stopped. A persister that stays hands each room it holds whose stable choice is now another
  writer to that writer once it hears it (`RoomLeases.release`), so an added persister gets its
  share as soon as it runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import asyncpg
from prometheus_client import CollectorRegistry, Counter

from idgen import MultiWriterIdGenerator
from idgen.multi_writer import DATABASE_ERRORS
from pubsub.client import ReplicationClient
from pubsub.tasks import cancel_and_wait
from workers.assembly.ephemeral import Ephemeral
from workers.assembly.stored import StoredStreams
from workers.config import STORED_STREAMS, ConfigError, WorkerConfig, load_config
from workers.handlers.caches.applied import AppliedRangesRecorder
from workers.handlers.placement.room_leases import RoomLeases
from workers.handlers.rooms.persist import EventPersister
from workers.handlers.rooms.writes import RoomWrites
from workers.process.instance_lease import fence_out
from workers.process.previous_release import PreviousRelease
from workers.routing import writer_for_room
from workers.streams.caches import CACHES
from workers.streams.events import EVENTS


class WorkerParts(Protocol):
    """What a reload changes and uses of `workers.app.Worker`."""

    name: str
    config: WorkerConfig
    generators: dict[str, MultiWriterIdGenerator]
    replication: ReplicationClient
    ephemeral: Ephemeral
    room_writes: RoomWrites
    stored: StoredStreams
    room_leases: RoomLeases | None
    previous_release: PreviousRelease | None
    applied: AppliedRangesRecorder | None
    persister: EventPersister | None
    backfill_persister: EventPersister | None

    @property
    def pool(self) -> asyncpg.Pool: ...
    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def started(self) -> bool: ...
    @property
    def stopping(self) -> bool: ...


log = logging.getLogger(__name__)
#: The settings a running worker takes from a reloaded file.
ONLINE = ("stream_writers", "instance_map")
#: Streams whose one writer keeps its state in memory: their writers change at a restart only.
RESTART_STREAMS = ("typing", "presence")
#: The streams whose writers a reload may change (backfill follows events).
LIVE_STREAMS = (EVENTS, CACHES, *STORED_STREAMS)
#: How often a persister looks whether the writers its rooms move to are heard, and a worker
#: whether a removed writer's name is free.
POLL_S = 0.5
#: The longest one settle of a removed writer's rows may take before it is tried again.
SETTLE_S = 10.0
#: How long a stopping writer tries to release its rooms and users (PostgreSQL may be unreachable).
RELEASE_S = 3.0


@dataclass(frozen=True, slots=True)
class WriterChange:
    """How one stream's writers changed (`reordered`: same writers, another order, so another
    stable choice for some rooms or users)."""

    stream: str
    added: tuple[str, ...]
    removed: tuple[str, ...]
    reordered: bool

    def describe(self) -> str:
        parts = [f"+{w}" for w in self.added] + [f"-{w}" for w in self.removed]
        return f"{self.stream}: {' '.join(parts) or 'reordered'}"


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """What a reload changes: `config` is the one to run with (the new writers and instance map,
    every other setting as before)."""

    config: WorkerConfig
    changes: tuple[WriterChange, ...]
    instance_map: bool
    #: Settings changed in the file that keep their old values until a restart.
    restart_only: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.changes and not self.instance_map

    def describe(self) -> str:
        parts = [c.describe() for c in self.changes]
        if self.instance_map:
            parts.append("instance_map changed")
        return "; ".join(parts) or "no change of the writers or the instance map"


class ReloadRefused(ConfigError):
    """The reloaded file cannot be applied while running; nothing changed."""


def plan_reload(old: WorkerConfig, new: WorkerConfig) -> ReloadPlan:
    """What running with `new` instead of `old` changes online; `ReloadRefused` when the result
    does not validate or would make this worker a writer of a stream it does not write."""
    restart_only = [
        name
        for name in type(old).model_fields
        if name not in ONLINE and getattr(old, name) != getattr(new, name)
    ]
    stream_writers = dict(new.stream_writers)
    for stream in RESTART_STREAMS:
        if old.configured_writers(stream) != new.configured_writers(stream):
            restart_only.append(f"stream_writers.{stream}")
        stream_writers.pop(stream, None)
        if stream in old.stream_writers:
            stream_writers[stream] = old.configured_writers(stream)
    data: dict[str, Any] = {**old.model_dump(), "stream_writers": stream_writers}
    data["instance_map"] = new.instance_map
    try:
        config = load_config(None, **data)
    except ConfigError as e:
        raise ReloadRefused(str(e)) from None
    if not config.writers_of(EVENTS):
        raise ReloadRefused("stream_writers names no writer of the 'events' stream")
    changes = []
    for stream in LIVE_STREAMS:
        before, after = old.writers_of(stream), config.writers_of(stream)
        if before == after:
            continue
        added = tuple(w for w in after if w not in before)
        if old.instance_name in added:
            raise ReloadRefused(
                f"{old.instance_name} would become a writer of {stream}: a worker takes on a stream's"
                " writes only at start (restart it with the new configuration)"
            )
        removed = tuple(w for w in before if w not in after)
        changes.append(WriterChange(stream, added, removed, not added and not removed))
    return ReloadPlan(config, tuple(changes), config.instance_map != old.instance_map, tuple(restart_only))


class ConfigReload:
    """Reads the worker's file again (`read`): the plan to apply, or None (logged: refused, or
    nothing to change). Holds the configuration the worker runs with now."""

    def __init__(
        self, path: str | Path, config: WorkerConfig, registry: CollectorRegistry | None = None
    ) -> None:
        self.path = Path(path)
        self.config = config
        self.outcomes = Counter(
            "fanout_config_reloads", "Configuration reloads (SIGHUP) by outcome: applied, unchanged, refused",
            ["outcome"], registry=registry,
        )  # fmt: skip

    def read(self) -> ReloadPlan | None:
        try:
            plan = plan_reload(self.config, load_config(self.path))
        except ConfigError as e:
            self.outcomes.labels("refused").inc()
            log.error("config reload refused, nothing changed: %s", " ".join(str(e).split()))
            return None
        if plan.restart_only:
            log.warning(
                "config reload: %s changed in %s; these need a restart and keep their old values until then",
                ", ".join(plan.restart_only), self.path,
            )  # fmt: skip
        if plan.empty:
            self.outcomes.labels("unchanged").inc()
            log.info("config reload: no change of the writers or the instance map")
            return None
        self.config = plan.config
        self.outcomes.labels("applied").inc()
        log.info("config reload: %s", plan.describe())
        return plan


class LiveWriters:
    """Applies reload plans to a running worker and carries out what follows (rooms handed on,
    removed writers retired); `stop()` ends what is still running."""

    def __init__(self, worker: WorkerParts) -> None:
        self.worker = worker
        self._reload: ConfigReload | None = None
        self._retiring: dict[str, asyncio.Task[None]] = {}
        self._rooms: asyncio.Task[None] | None = None
        #: A stored stream this worker no longer writes: its users handed on (`UserStreamWrites.drain`).
        self._users: list[asyncio.Task[bool]] = []
        #: Rooms this persister handed to another writer since it started.
        self.handed_on = 0

    def reload(self, path: str) -> None:
        """SIGHUP: read the configuration file `path` again and apply what changes online."""
        worker = self.worker
        if not worker.started or worker.stopping:
            log.warning(
                "config reload ignored: the worker is %s", "stopping" if worker.stopping else "starting"
            )
            return
        if self._reload is None:
            self._reload = ConfigReload(path, worker.config, worker.registry)
        plan = self._reload.read()
        if plan is not None:
            self.apply(plan)

    def apply(self, plan: ReloadPlan) -> None:
        worker = self.worker
        worker.config = plan.config
        if plan.instance_map:
            worker.ephemeral.requests.instance_map = dict(plan.config.instance_map)
        for name in [n for n in self._retiring if self._leaving(n) == []]:  # listed again
            self._retiring.pop(name).cancel()
        for stream, generator in worker.generators.items():
            wanted = worker.config.writers_of(stream)
            leaving = [w for w in generator.writers if w not in wanted and w != worker.name]
            self._set_writers(stream, [*wanted, *leaving])
            for writer in leaving:
                if writer not in self._retiring:
                    task = asyncio.create_task(self._retire(writer), name=f"retire:{writer}")
                    self._retiring[writer] = task
        events = worker.config.writers_of(EVENTS)
        writes = worker.room_writes
        writes.writers = list(events)
        writes.placement.set_writers(events)
        for stream, stream_writes in worker.stored.writes.items():
            stream_writes.writers = worker.config.writers_of(stream)
            stream_writes.placement.set_writers(stream_writes.writers)
            users = stream_writes.leases
            if users is not None and not users.closed and worker.name not in stream_writes.writers:
                drained = stream_writes.drain(worker.config.writer_wait_s)
                self._users.append(asyncio.create_task(drained, name=f"reload:users:{stream}"))
        leases = worker.room_leases
        if leases is None or leases.closed or not any(c.stream == EVENTS for c in plan.changes):
            return
        if worker.previous_release is not None:
            leases.hashed_writer = functools.partial(worker.previous_release.hashed_writer, writers=events)
        leases.moved = {room: w for room, w in leases.moved.items() if writer_for_room(room, events) == w}
        if self._rooms is not None:
            self._rooms.cancel()
        step = self._step_down() if worker.name not in events else self._hand_on(events)
        self._rooms = asyncio.create_task(step, name="reload:rooms")

    def _set_writers(self, stream: str, writers: list[str]) -> None:
        generator = self.worker.generators[stream]
        if set(generator.writers) == set(writers):
            return
        handler = self.worker.replication.handler
        added = [w for w in writers if w not in generator.writers]
        generator.set_writers(writers)
        handler.set_writers(stream, writers)
        applied = self.worker.applied
        if stream == CACHES and applied is not None:
            for writer in added:
                applied.begin(writer, generator.get_current_token_for_writer(writer))

    def _leaving(self, writer: str) -> list[str]:
        """The streams `writer` was removed from and still counts in here."""
        worker = self.worker
        return [
            stream
            for stream, generator in worker.generators.items()
            if writer in generator.writers and writer not in worker.config.writers_of(stream)
        ]

    async def _retire(self, writer: str) -> None:
        """Once `writer`'s name is free: fence it, apply its last rows, stop counting it."""
        worker = self.worker
        key = f"{worker.config.channel_prefix}/{writer}"
        pool = worker.pool
        while True:
            try:
                async with pool.acquire() as conn:
                    fenced = await fence_out(conn, key, worker.config.instance_lease_s)
                if fenced and await self._settle(writer):
                    break
            except DATABASE_ERRORS as e:
                log.warning("retiring writer %s: %s; trying again", writer, e or type(e).__name__)
            await asyncio.sleep(POLL_S)
        streams = self._leaving(writer)
        for stream in streams:
            self._set_writers(stream, [w for w in worker.generators[stream].writers if w != writer])
        self._retiring.pop(writer, None)
        log.info("writer %s retired: it no longer counts in the positions of %s", writer, ", ".join(streams))

    async def _settle(self, writer: str) -> bool:
        """Apply `writer`'s rows up to each stream's end (it writes no more); True once done."""
        worker = self.worker
        streams = worker.replication.read_streams
        loop = asyncio.get_running_loop()
        for name in self._leaving(writer):
            stream = streams.get(name)
            if stream is None:
                continue
            end = await stream.max_token()
            if end is None or stream.current_token(writer) >= end:
                continue
            worker.replication.handler.settle(name, writer, end)
            deadline = loop.time() + SETTLE_S
            while stream.current_token(writer) < end:
                if loop.time() > deadline:
                    return False
                await asyncio.sleep(0.05)
        return True

    async def _step_down(self) -> None:
        """No longer an events writer: finish the queued writes, release every room, as on SIGTERM."""
        worker = self.worker
        assert worker.room_leases is not None
        worker.room_leases.closed = True
        for persister in (worker.persister, worker.backfill_persister):
            if persister is not None:
                await persister.stop()
        await self.release_rooms()
        log.warning(
            "%s is no longer a writer of events: queued writes finished, rooms released; it writes no"
            " events now and should be stopped (SIGTERM)", worker.name,
        )  # fmt: skip

    async def _hand_on(self, events: list[str]) -> None:
        """Hand each held room whose stable choice is now another writer to it, once heard."""
        worker = self.worker
        leases = worker.room_leases
        assert leases is not None
        while True:
            stable = {room: writer_for_room(room, events) for room in list(leases.held)}
            moving = {room: w for room, w in stable.items() if w != worker.name}
            ready = {room: w for room, w in moving.items() if leases.hears(w)}
            if ready:
                if any(p.unknown_outcomes for p in (worker.persister, worker.backfill_persister) if p):
                    log.warning("rooms not handed on: a batch of unknown outcome (they move at a restart)")
                    return
                gate = worker.room_writes.gate
                released = await leases.release(ready, gate.writing, worker.config.writer_wait_s)
                self.handed_on += released
                counts = collections.Counter(ready.values())
                log.info("rooms handed on after the writers changed: %d (%s)", released,
                         " ".join(f"{w}={n}" for w, n in sorted(counts.items())))  # fmt: skip
            if len(ready) == len(moving):
                return
            await asyncio.sleep(POLL_S)

    async def release_rooms(self) -> None:
        """Hand this persister's rooms on, once its writes drained and no commit outcome is left
        unknown (such a batch may still commit: its rooms move only when this lease expires)."""
        worker = self.worker
        assert worker.room_leases is not None
        persisters = [p for p in (worker.persister, worker.backfill_persister) if p is not None]
        unknown = sum(p.unknown_outcomes for p in persisters)
        if unknown:
            log.warning("rooms kept until the instance lease expires: %d batches of unknown outcome", unknown)
            return
        unfinished = sum(p.unfinished for p in persisters)
        if unfinished:  # the drain was cut short: a release now could let them commit after it
            log.warning("rooms kept until the instance lease expires: %d writes not drained", unfinished)
            return
        try:
            await asyncio.wait_for(worker.room_leases.release_all(), RELEASE_S)
        except DATABASE_ERRORS as e:
            log.warning("rooms not released (PostgreSQL: %s); they move when the instance lease expires",
                        e or type(e).__name__)  # fmt: skip

    async def stop(self) -> None:
        rooms = [self._rooms] if self._rooms is not None else []
        tasks = [*self._retiring.values(), *rooms, *self._users]
        with contextlib.suppress(Exception):
            await cancel_and_wait(*tasks)
