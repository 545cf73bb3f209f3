"""Histograms cheap enough for a per-line path: plain lists of bucket counts, turned into Prometheus
samples only when the registry is collected (a scrape).

prometheus_client's `Histogram.observe` takes a lock and walks its buckets in Python (about a
microsecond; `.labels()` adds several more). Here a child is bound to its labels once, by the code
that owns the path, and `observe` is one `bisect` and two additions. The contract: children are
observed from one thread (the event loop); a scrape from another thread may read a count one
observation ahead of the sum, never a torn value.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

#: Seconds: 100 µs to 10 s (the replication stages are sub-millisecond when idle).
STAGE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
)  # fmt: skip


class HistogramChild:
    """One label set's buckets: `counts[i]` holds the observations in (bounds[i-1], bounds[i]],
    the last one those above every bound."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """`count` observations of `value` (a batch whose items all waited as long)."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.sum += value * count


class LockFreeHistogram(Collector):
    """A labelled histogram family registered on `registry`; bind children with `labels()` once."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        buckets: Sequence[float] = STAGE_BUCKETS,
    ) -> None:
        self.name = name
        self._doc = documentation
        self._labelnames = list(labelnames)
        self._bounds = tuple(float(b) for b in buckets)
        if list(self._bounds) != sorted(set(self._bounds)):
            raise ValueError(f"{name}: buckets must be strictly increasing, got {list(buckets)}")
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        """The child of these label values (created on first use, the same object afterwards)."""
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self.name} takes labels {self._labelnames}, got {list(values)}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = HistogramChild(self._bounds)
        return child

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self._doc, labels=self._labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self._doc, labels=self._labelnames)
        edges = [floatToGoString(b) for b in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        for values, child in sorted(self._children.items()):
            running, buckets = 0, []
            for edge, count in zip(edges, list(child.counts), strict=True):
                running += count
                buckets.append((edge, running))
            family.add_metric(list(values), buckets, child.sum)
        yield family
