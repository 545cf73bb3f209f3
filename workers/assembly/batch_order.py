"""The ordering rule on every batch, replicated or this worker's own: invalidate the caches, let
the ID generator advance, then wake the readers. Any other order serves stale data.

`BatchOrder` holds the callbacks that keep it. For another writer's rows, pubsub calls `apply`
(invalidate, remember which rooms and users to wake) before it advances the generator, then
`position_moved` (wake them). For this worker's own batches, the persisters call `committed`
inside the ID blocks (invalidate, stage the rows for RDATA), then `finished` once the IDs are
finished and published (wake, through `DeferredWakes`, which holds an event batch's wakes until
this writer's own position covers it); `uncertain` and `cache_row_uncertain` handle a batch whose
commit outcome stayed unknown. It reads the worker's parts through `OrderedParts` and must not
import `workers.app`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, cast

from idgen import MultiWriterIdGenerator
from pubsub.client import ReplicationClient
from pubsub.streams import Stream
from pubsub.types import Row
from workers.assembly.stored import StoredStreams
from workers.config import STORED_STREAMS, WorkerConfig
from workers.handlers.caches.applied import AppliedRangesRecorder
from workers.handlers.caches.lru import SyncCaches
from workers.handlers.notify.notifier import DeferredWakes, Notifier
from workers.handlers.rooms.rules import RoomViews
from workers.handlers.rooms.versions import RoomVersions
from workers.handlers.sync.handler import SyncHandler
from workers.handlers.sync.recent_events import ref_of, ref_of_row
from workers.model import REDACTION_EVENT, CacheInvalidation, Event, redacts_of
from workers.process.metrics import WorkerMetrics
from workers.streams.caches import CACHES, CacheRow
from workers.streams.events import BACKFILL, EVENTS, EventRow


class OrderedParts(Protocol):
    """What the ordering rule touches of `workers.app.Worker` (read when a batch arrives: some
    parts are built after this object)."""

    @property
    def name(self) -> str: ...
    @property
    def config(self) -> WorkerConfig: ...
    @property
    def caches(self) -> SyncCaches: ...
    @property
    def room_views(self) -> RoomViews: ...
    @property
    def room_versions(self) -> RoomVersions: ...
    @property
    def sync(self) -> SyncHandler: ...
    @property
    def stored(self) -> StoredStreams: ...
    @property
    def applied(self) -> AppliedRangesRecorder | None: ...
    @property
    def notifier(self) -> Notifier: ...
    @property
    def metrics(self) -> WorkerMetrics: ...
    @property
    def replication(self) -> ReplicationClient: ...
    @property
    def generators(self) -> dict[str, MultiWriterIdGenerator]: ...


class BatchOrder:
    """The ordering rule's callbacks for one worker (see the module docstring)."""

    def __init__(self, worker: OrderedParts, event_wakes: DeferredWakes) -> None:
        self._worker = worker
        self._event_wakes = event_wakes
        #: stream -> (rooms, users) its applied rows touched, woken when its position moves.
        self._woken: dict[str, tuple[set[str], set[str]]] = {}

    async def apply(
        self, stream: Stream[Any], instance: str, token: int, rows: Sequence[tuple[int, Row]]
    ) -> None:
        w = self._worker
        rooms, users = self._woken.setdefault(stream.name, (set(), set()))
        if stream.name in (EVENTS, BACKFILL):  # a redacted event's cached body is stale
            w.sync.bodies.forget([r.redacts for _, r in rows if isinstance(r, EventRow) and r.redacts])
        if stream.name == EVENTS:
            placed = cast("Sequence[tuple[int, EventRow]]", rows)  # a stream's rows are of its row type
            event_rows = [r for _, r in placed]
            w.caches.on_events(placed)
            w.sync.recent.add([ref_of_row(t, instance, r) for t, r in placed])
            for event_row in event_rows:
                w.room_versions.learn(event_row.room_id, event_row.room_version)
            w.metrics.events_applied.inc(len(event_rows))
            rooms.update([row.room_id for row in event_rows])
            users.update(
                [r.state_key for r in event_rows if r.membership is not None and r.state_key is not None]
            )
        elif stream.name == CACHES:
            cache_rows = [r for _, r in rows if isinstance(r, CacheRow)]
            w.caches.on_invalidations(r.to_domain() for r in cache_rows)
            w.metrics.invalidations.labels("replication").inc(len(rows))
            now_ms = time.time() * 1000
            for row in cache_rows:
                w.metrics.commit_to_applied.observe(max(0.0, now_ms - row.invalidation_ts) / 1000)
        elif stream.name in STORED_STREAMS:
            woken_rooms, woken_users = await w.stored.apply(stream.name, rows, instance)
            rooms |= woken_rooms
            users |= woken_users

    def foreign_writer(self, stream: str, _instance: str) -> None:
        w = self._worker
        if stream == EVENTS:
            w.sync.recent.blind()

    def position_moved(self, stream: str, instance: str, token: int) -> None:
        w = self._worker
        if stream == CACHES and w.applied is not None:
            w.applied.advanced(instance, token)
        rooms, users = self._woken.pop(stream, (set(), set()))
        if rooms or users:
            w.notifier.notify(rooms, users)
        self._event_wakes.release()  # held behind an own batch that failed, if any
        w.notifier.position_moved()

    def committed(
        self,
        events: Sequence[Event],
        rows: Sequence[str],
        invalidations: Sequence[tuple[int, CacheInvalidation]],
    ) -> None:
        """Inside the ID blocks, after commit: invalidate our caches, stage the rows for RDATA."""
        w = self._worker
        w.caches.on_events((e.stream_ordering, e) for e in events)
        w.room_views.on_committed(events)
        redacted = [e for e in events if e.type == REDACTION_EVENT]  # their targets' bodies are stale
        w.sync.bodies.forget([r for e in redacted if (r := redacts_of(e.type, e.content)) is not None])
        if w.config.serve_reads and events and events[0].stream_ordering > 0:
            w.sync.recent.add([ref_of(e) for e in events])
        w.caches.on_invalidations(row for _, row in invalidations)
        w.metrics.invalidations.labels("local").inc(len(invalidations))
        if events and events[0].stream_ordering > 0:
            w.replication.stage_rows(EVENTS, zip([e.stream_ordering for e in events], rows, strict=True))
        elif events:
            w.replication.stage_rows(BACKFILL, zip([-e.stream_ordering for e in events], rows, strict=True))
        if invalidations:
            w.replication.stage_rows(CACHES, [(i, CacheRow.of(row)) for i, row in invalidations])

    def uncertain(self, events: Sequence[Event], cache_ids: Sequence[int]) -> None:
        """A batch failed where its commit may have happened: readers are made to fetch its IDs
        from the database (`stage_unknown`), and this worker forgets what the batch may have changed."""
        w = self._worker
        if not events:
            return
        if events[0].stream_ordering > 0:
            w.replication.stage_unknown(EVENTS, max(e.stream_ordering for e in events))
            w.sync.recent.forget(max(e.stream_ordering for e in events))
        else:
            w.replication.stage_unknown(BACKFILL, max(-e.stream_ordering for e in events))
        if cache_ids:
            w.replication.stage_unknown(CACHES, max(cache_ids))
        w.caches.forget_events(events)
        w.room_views.on_events(events)

    def cache_row_uncertain(self, stream_id: int, row: CacheInvalidation) -> None:
        """A caches row whose transaction failed where it may have committed: applied here (an
        invalidation is always safe) and fetched from the database by readers."""
        w = self._worker
        w.caches.on_invalidations([row])
        w.replication.stage_unknown(CACHES, stream_id)

    def finished(
        self,
        events: Sequence[Event],
        rows: Sequence[str],
        invalidations: Sequence[tuple[int, CacheInvalidation]],
    ) -> None:
        """The IDs are finished (and published: `on_finished` of the generators): wake local readers."""
        w = self._worker
        if invalidations and w.applied is not None:
            # Batches may finish out of order: our own position only covers finished IDs, and
            # every finished batch ran `committed` (invalidated here) before finishing.
            w.applied.advanced(w.name, w.generators[CACHES].get_current_token_for_writer(w.name))
        w.metrics.persisted.inc(len(events))
        if events and events[0].stream_ordering > 0:  # a batch is all live or all backfill
            self._event_wakes.add(
                events[-1].stream_ordering,
                {e.room_id for e in events},
                {e.state_key for e in events if e.state_key and e.membership},
            )
        w.notifier.position_moved()
