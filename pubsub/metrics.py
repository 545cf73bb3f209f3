"""Prometheus metrics of one replication client, in its own `CollectorRegistry`.

A registry per client lets several clients live in one process (tests, benchmarks) without
name clashes; the worker app exposes `client.metrics.registry`. Hot-path children (labels) are
cached in dicts because `.labels()` costs microseconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ReplicationMetrics:
    """Counters and gauges; every method is cheap enough for the receive path."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.commands_in = Counter(
            "fanout_repl_commands_in", "Commands received", ["command", "stream"], registry=r
        )
        self.commands_out = Counter(
            "fanout_repl_commands_out", "Commands sent", ["command", "stream"], registry=r
        )
        self.bytes_in = Counter("fanout_repl_bytes_in", "Bytes received on pub/sub", registry=r)
        self.bytes_out = Counter("fanout_repl_bytes_out", "Bytes published", registry=r)
        self.rejected = Counter("fanout_repl_rejected", "Lines rejected, by reason", ["reason"], registry=r)
        self.dropped = Counter(
            "fanout_repl_dropped",
            "Commands dropped on purpose (catch-up covers them)",
            ["reason"],
            registry=r,
        )
        self.catch_up_fetches = Counter(
            "fanout_repl_catch_up_fetches", "Update-function calls", ["stream"], registry=r
        )
        self.catch_up_rows = Counter(
            "fanout_repl_catch_up_rows", "Rows fetched by catch-ups", ["stream"], registry=r
        )
        self.reconnects = Counter(
            "fanout_repl_reconnects", "(Re)subscriptions after the first", ["kind"], registry=r
        )
        self.publish_errors = Counter("fanout_repl_publish_errors", "Failed publishes", registry=r)
        self.position = Gauge(
            "fanout_repl_position", "Applied position per stream and writer", ["stream", "writer"], registry=r
        )
        self.lag = Gauge(
            "fanout_repl_lag", "Announced minus applied position", ["stream", "writer"], registry=r
        )
        self.silent = Gauge(
            "fanout_repl_writer_silent", "1: a writer stopped announcing", ["stream", "writer"], registry=r
        )
        self._in: dict[tuple[str, str], Counter] = {}
        self._out: dict[tuple[str, str], Counter] = {}

    def command_in(self, name: str, stream: str) -> None:
        child = self._in.get((name, stream))
        if child is None:
            child = self._in[(name, stream)] = self.commands_in.labels(name, stream)
        child.inc()

    def command_out(self, name: str, stream: str, count: int = 1) -> None:
        child = self._out.get((name, stream))
        if child is None:
            child = self._out[(name, stream)] = self.commands_out.labels(name, stream)
        child.inc(count)

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped.labels(reason).inc(count)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Sum of the samples called `name` whose labels include `labels` (0 when none), for tests
        and `health()`."""
        wanted = (labels or {}).items()
        total = 0.0
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name == name and wanted <= sample.labels.items():
                    total += sample.value
        return total
