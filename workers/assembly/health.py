"""What /health says of a worker, and its readiness: from in-memory state only (no query), so a
probe costs nothing and answers while PostgreSQL is away.

Ready = started, accepting requests, subscribed to Redis, PostgreSQL reachable (the background
probe's last answer) and caught up to the positions live writers announced. A writer silent past
`silent_writer_s` makes the worker `degraded`, never unready: one dead persister must not take
every sync worker out of service. It reads the worker's parts through `HealthParts` (the parts
exist once start-up built them) and must not import `workers.app`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any, Protocol

from idgen import MultiWriterIdGenerator
from pubsub.client import ReplicationClient
from workers.handlers.rooms.persist import EventPersister
from workers.handlers.rooms.stats import RoomStatsTask
from workers.process.reachability import PostgresProbe


class HealthParts(Protocol):
    """What health reads of `workers.app.Worker`."""

    @property
    def name(self) -> str: ...
    @property
    def started(self) -> bool: ...
    @property
    def accepting(self) -> bool: ...
    @property
    def lease_lost(self) -> asyncio.Event: ...
    @property
    def replication(self) -> ReplicationClient: ...
    @property
    def generators(self) -> dict[str, MultiWriterIdGenerator]: ...
    @property
    def persister(self) -> EventPersister | None: ...
    @property
    def room_stats(self) -> RoomStatsTask | None: ...
    @property
    def postgres_probe(self) -> PostgresProbe | None: ...


class WorkerHealth:
    """`health()` for /health and `readiness()` for /health/ready and the scrape's gauges."""

    def __init__(self, worker: HealthParts) -> None:
        self._worker = worker

    def health(self) -> tuple[bool, dict[str, Any]]:
        w = self._worker
        ready, degraded, reasons, degraded_reasons = self.readiness()
        detail: dict[str, Any] = {
            "instance": w.name,
            "pid": os.getpid(),
            "accepting": w.accepting,
            "replication": w.replication.health(),
            "persisted_upto": {s: g.get_current_token() for s, g in w.generators.items()},
        }
        if w.persister is not None:
            p = w.persister
            detail["persister"] = {"events": p.events, "batches": p.batches, "rides": p.rides,
                                   "queued": p.queued, "batches_in_flight": p.batches_in_flight}  # fmt: skip
        if w.room_stats is not None:
            detail["room_stats"] = {"position": w.room_stats.position, "processed": w.room_stats.processed}
        detail.update(reasons=reasons, degraded=degraded, degraded_reasons=degraded_reasons)
        return ready, detail

    def readiness(self) -> tuple[bool, bool, list[str], list[str]]:
        """(ready, degraded, why not ready, why degraded)."""
        client = self._worker.replication
        now = asyncio.get_running_loop().time()
        silent = client.handler.silent_writers(now, client.silent_after_s)
        reasons = self._unready_reasons(
            client.transport.subscribed.is_set(),
            {(s, w) for s, w, _ in silent},
            client.handler.stream_status(now),
        )
        degraded_reasons = [f"writer {w} of {s} silent for {round(q, 3)}s" for s, w, q in silent]
        return not reasons, bool(silent), reasons, degraded_reasons

    def _unready_reasons(
        self, subscribed: bool, silent: set[tuple[str, str]], streams: dict[str, dict[str, dict[str, Any]]]
    ) -> list[str]:
        """Why this worker is not ready (empty: ready). Silent writers are never a reason."""
        w = self._worker
        reasons = []
        if not w.started:
            reasons.append("starting")
        if not w.accepting:
            reasons.append("stopping" if not w.lease_lost.is_set() else "lost its instance name")
        if not subscribed:
            reasons.append("Redis: not subscribed")
        if w.postgres_probe is not None and w.postgres_probe.error is not None:
            reasons.append(f"PostgreSQL: {w.postgres_probe.error}")
        for stream, writer, state in _positions(streams):
            announced = state["announced"]
            if (stream, writer) in silent or announced is None or state["position"] >= announced:
                continue
            reasons.append(f"catching up: {stream} from {writer} at {state['position']} of {announced}")
        return reasons


def _positions(streams: dict[str, dict[str, dict[str, Any]]]) -> Iterable[tuple[str, str, dict[str, Any]]]:
    for stream, writers in streams.items():
        for writer, state in writers.items():
            yield stream, writer, state
