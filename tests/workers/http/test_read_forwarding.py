"""Which reader a relayed read goes to: the order is stable per client and spread over readers
(tests/cluster/test_read_relay.py runs the relay itself, a non-reader's refusal included)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from workers.http.read_forwarding import ReadRouting
from workers.http.requests import WorkerRequests


def test_a_client_keeps_to_one_reader() -> None:
    routing = ReadRouting("p1", False, [], request_timeout_s=5.0)
    urls = {name: f"http://127.0.0.1:{port}" for name, port in (("p1", 1), ("p2", 2), ("s1", 3), ("s2", 4))}
    routing.requests = WorkerRequests(urls, "secret-0123456789abcdef", CollectorRegistry())
    first = routing.candidates("Bearer token-a")
    assert sorted(first) == ["p2", "s1", "s2"]  # every other instance, never itself
    assert routing.candidates("Bearer token-a") == first
    tokens = [f"Bearer token-{i}" for i in range(50)]
    assert {routing.candidates(t)[0] for t in tokens} == {"p2", "s1", "s2"}  # spread over readers


def test_read_workers_when_given_are_the_only_readers() -> None:
    routing = ReadRouting("p1", False, ["s2", "p1"], request_timeout_s=5.0)
    assert routing.candidates("anything") == ["s2"]
