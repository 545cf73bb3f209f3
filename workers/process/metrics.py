"""The Prometheus series a worker feeds from its own code paths (the replication client, the HTTP
layer, the caches and readiness register theirs elsewhere). One object, built once per worker on
its registry, so every name and bucket is in one place; docs/operations.md lists them."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from pubsub.histograms import LockFreeHistogram

#: Seconds, for the latencies below: 1 ms to 10 s.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
#: The kinds of /sync answer (`workers.handlers.sync.handler.SyncObservers.answered`).
SYNC_KINDS = ("initial", "incremental", "woken", "timeout")


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, waiting: Callable[[], float]) -> None:
        self.events_applied = Counter(
            "fanout_events_applied_total", "Events rows applied from replication", registry=registry
        )
        self.invalidations = Counter(
            "fanout_cache_invalidations_total",
            "Cache invalidation rows applied",
            ["origin"],
            registry=registry,
        )
        self.persisted = Counter("fanout_events_persisted_total", "Events persisted here", registry=registry)
        # Observed per replicated caches row and per event of each woken /sync: lock-free.
        self.commit_to_applied = LockFreeHistogram(
            "fanout_repl_commit_to_applied_seconds",
            "From a writer's batch commit (its caches row's timestamp) to this worker applying it",
            [], registry, LATENCY_BUCKETS,
        ).labels()  # fmt: skip
        self.persist_to_visible = LockFreeHistogram(
            "fanout_persist_to_visible_seconds",
            "From an event's persist to the woken /sync answer that carries it",
            [], registry, LATENCY_BUCKETS,
        ).labels()  # fmt: skip
        self.sync_wake = LockFreeHistogram(
            "fanout_sync_wake_seconds", "From the notify that wakes a /sync long-poll to its answer",
            [], registry, LATENCY_BUCKETS,
        ).labels()  # fmt: skip
        self.tokens_clamped = Counter(
            "fanout_sync_tokens_clamped_total",
            "since tokens beyond every sequence (a restored database, a forgery), answered from what exists",
            registry=registry,
        )
        self.behind_timeouts = Counter(
            "fanout_sync_behind_timeouts_total",
            "since tokens this worker did not catch up with in time (answered empty, token unchanged)",
            registry=registry,
        )
        by_kind = LockFreeHistogram(
            "fanout_sync_seconds",
            "/sync answer time by kind: initial, incremental (no wait), woken (answered after a"
            " wake-up), timeout (waited the whole timeout)",
            ["kind"], registry, buckets=(*LATENCY_BUCKETS, 30, 60),
        )  # fmt: skip
        self._sync_by_kind = {kind: by_kind.labels(kind) for kind in SYNC_KINDS}
        # Read at scrape time, never by /health.
        Gauge("fanout_sync_waiting", "Long-polls waiting", registry=registry).set_function(waiting)

    def sync_answered(self, kind: str, seconds: float) -> None:
        """One /sync answer of `kind` (one of `SYNC_KINDS`) that took `seconds`."""
        self._sync_by_kind[kind].observe(seconds)
