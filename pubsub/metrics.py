"""Prometheus metrics of one replication client, in its own `CollectorRegistry`.

A registry per client lets several clients live in one process (tests, benchmarks) without
name clashes; the worker app exposes `client.metrics.registry`.

The receive path runs for every message of every writer, so counting there must cost next to
nothing: the counters are plain ints and dicts here, turned into Prometheus samples only when the
registry is collected (a scrape). prometheus_client's `Counter.inc` takes a lock and costs about a
microsecond; with `.labels()` several (profiled in `fanout bench pubsub`). Positions and lags are
not stored at all: `gauge_source` reads them live at collection time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pubsub.histograms import HistogramChild, LockFreeHistogram

#: () -> [(stream, writer, applied position, announced minus applied)]
GaugeSource = Callable[[], Iterable[tuple[str, str, int, int]]]

_LABELLED = {
    # attribute: (metric name, help, label names)
    "commands_in": ("fanout_repl_commands_in", "Commands received", ("command", "stream")),
    "commands_out": ("fanout_repl_commands_out", "Commands sent", ("command", "stream")),
    "rejected": ("fanout_repl_rejected", "Lines rejected, by reason", ("reason",)),
    "dropped": ("fanout_repl_dropped", "Commands dropped on purpose (catch-up covers them)", ("reason",)),
    "catch_up_fetches": ("fanout_repl_catch_up_fetches", "Update-function calls", ("stream",)),
    "catch_up_rows": ("fanout_repl_catch_up_rows", "Rows fetched by catch-ups", ("stream",)),
    "dependency_catch_ups": (
        "fanout_repl_dependency_catch_ups",
        "Catch-ups of a writer that a row of another writer depended on (a key that moved)",
        ("stream",),
    ),
    "reconnects": ("fanout_repl_reconnects", "(Re)subscriptions after the first", ("kind",)),
    "witnesses": (
        "fanout_repl_witnessed",
        "Live lines whose token a row found stored proved, with no sequence read of their own",
        ("stream",),
    ),
}


class ReplicationMetrics:
    """Counters and gauges; every method is cheap enough for the receive path.

    Counters keyed by label tuples; `value(name, labels)` reads them back as Prometheus would.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.bytes_in = 0
        self.bytes_out = 0
        self.publish_errors = 0
        self.commands_in: dict[tuple[str, ...], int] = {}
        self.commands_out: dict[tuple[str, ...], int] = {}
        self.rejected: dict[tuple[str, ...], int] = {}
        self.dropped: dict[tuple[str, ...], int] = {}
        self.catch_up_fetches: dict[tuple[str, ...], int] = {}
        self.catch_up_rows: dict[tuple[str, ...], int] = {}
        self.reconnects: dict[tuple[str, ...], int] = {}
        self.dependency_catch_ups: dict[tuple[str, ...], int] = {}
        #: Lines whose token a stored row proved, without a sequence read (`Stream.witness`).
        self.witnesses: dict[tuple[str, ...], int] = {}
        #: (stream, writer) -> 1 when the writer stopped announcing, else 0.
        self.silent: dict[tuple[str, str], int] = {}
        self.gauge_source: GaugeSource | None = None
        self.registry.register(_Collector(self))
        self._received_to_applied = LockFreeHistogram(
            "fanout_repl_received_to_applied_seconds",
            "From a live RDATA line's socket read to its rows applied (caches invalidated, position"
            " advanced), per row",
            ["stream"], self.registry,
        )  # fmt: skip
        self._applied_to_woken = LockFreeHistogram(
            "fanout_repl_applied_to_woken_seconds",
            "From rows applied to the position listeners done (the notifier woken), per apply",
            ["stream"], self.registry,
        )  # fmt: skip

    def stages(self, stream: str) -> tuple[HistogramChild, HistogramChild]:
        """The stream's (received -> applied, applied -> woken) histograms, bound once by its queue."""
        return self._received_to_applied.labels(stream), self._applied_to_woken.labels(stream)

    # -- receive and send path -------------------------------------------------------------------

    def command_in(self, name: str, stream: str, count: int = 1) -> None:
        key = (name, stream)
        self.commands_in[key] = self.commands_in.get(key, 0) + count

    def command_out(self, name: str, stream: str, count: int = 1) -> None:
        key = (name, stream)
        self.commands_out[key] = self.commands_out.get(key, 0) + count

    def reject(self, reason: str) -> None:
        key = (reason,)
        self.rejected[key] = self.rejected.get(key, 0) + 1

    def drop(self, reason: str, count: int = 1) -> None:
        key = (reason,)
        self.dropped[key] = self.dropped.get(key, 0) + count

    def catch_up_fetch(self, stream: str) -> None:
        key = (stream,)
        self.catch_up_fetches[key] = self.catch_up_fetches.get(key, 0) + 1

    def catch_up_fetched(self, stream: str, rows: int) -> None:
        key = (stream,)
        self.catch_up_rows[key] = self.catch_up_rows.get(key, 0) + rows

    def dependency_catch_up(self, stream: str) -> None:
        key = (stream,)
        self.dependency_catch_ups[key] = self.dependency_catch_ups.get(key, 0) + 1

    def witnessed(self, stream: str) -> None:
        key = (stream,)
        self.witnesses[key] = self.witnesses.get(key, 0) + 1

    def reconnect(self, kind: str) -> None:
        key = (kind,)
        self.reconnects[key] = self.reconnects.get(key, 0) + 1

    # -- reading ---------------------------------------------------------------------------------

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


class _Collector(Collector):
    """Turns the plain counters into Prometheus families at scrape time."""

    def __init__(self, metrics: ReplicationMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        for attr, (name, doc, labels) in _LABELLED.items():
            family = CounterMetricFamily(name, doc, labels=list(labels))
            values: dict[tuple[str, ...], int] = getattr(m, attr)
            for key, value in sorted(values.items()):
                family.add_metric(list(key), value)
            yield family
        yield CounterMetricFamily("fanout_repl_bytes_in", "Bytes received on pub/sub", value=m.bytes_in)
        yield CounterMetricFamily("fanout_repl_bytes_out", "Bytes published", value=m.bytes_out)
        yield CounterMetricFamily("fanout_repl_publish_errors", "Failed publishes", value=m.publish_errors)
        position = GaugeMetricFamily(
            "fanout_repl_position", "Applied position per stream and writer", labels=["stream", "writer"]
        )
        lag = GaugeMetricFamily(
            "fanout_repl_lag", "Announced minus applied position", labels=["stream", "writer"]
        )
        if m.gauge_source is not None:
            for stream, writer, applied, behind in m.gauge_source():
                position.add_metric([stream, writer], applied)
                lag.add_metric([stream, writer], behind)
        yield position
        yield lag
        silent = GaugeMetricFamily(
            "fanout_repl_writer_silent", "1: a writer stopped announcing", labels=["stream", "writer"]
        )
        for (stream, writer), value in sorted(m.silent.items()):
            silent.add_metric([stream, writer], value)
        yield silent
