"""The lock-free histogram exposes what prometheus_client's own would for the same observations."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pubsub.histograms import STAGE_BUCKETS, LockFreeHistogram


def test_the_exposition_matches_prometheus_clients_histogram() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = LockFreeHistogram("stage_seconds", "A stage", ["stream"], ours)
    reference = Histogram("stage_seconds", "A stage", ["stream"], registry=theirs, buckets=STAGE_BUCKETS)
    rng = random.Random(7)
    for stream in ("events", "caches"):
        child = fast.labels(stream)
        for value in [*STAGE_BUCKETS, 0.0, 99.0, *(rng.expovariate(200) for _ in range(500))]:
            weight = rng.randint(1, 3)
            child.observe(value, weight)
            for _ in range(weight):
                reference.labels(stream).observe(value)
    fast.labels("idle")
    reference.labels("idle")
    assert _samples(ours) == _samples(theirs)


def test_children_are_bound_once_and_labels_are_checked() -> None:
    family = LockFreeHistogram("x_seconds", "X", ["kind"], CollectorRegistry())
    assert family.labels("a") is family.labels("a")
    with pytest.raises(ValueError, match="takes labels"):
        family.labels("a", "b")
    with pytest.raises(ValueError, match="strictly increasing"):
        LockFreeHistogram("y_seconds", "Y", [], CollectorRegistry(), buckets=(1, 1))


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    """Sample lines as name{labels} -> value (sums compared to 9 places: the order of additions differs)."""
    found = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#") and "_created" not in line:
            key, value = line.rsplit(" ", 1)
            found[key] = round(float(value), 9)
    return found
