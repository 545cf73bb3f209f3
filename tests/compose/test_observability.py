"""Every metric the alert rules and the Grafana dashboard use exists on a real worker's /metrics,
scraped with no /health call before it (gauges are computed at scrape time)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import yaml

from tests.workers.conftest import MakeWorker, make_worker

__all__ = ["make_worker"]  # the in-process worker fixture, shared with tests/workers

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
_METRIC = re.compile(r"\bfanout_[a-z_]+")


def _used_metrics() -> set[str]:
    rules = yaml.safe_load((COMPOSE / "prometheus" / "alerts.yml").read_text())
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((COMPOSE / "grafana" / "fanout-dashboard.json").read_text())
    expressions += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    return {name for expression in expressions for name in _METRIC.findall(expression)}


async def test_every_used_metric_is_exposed(make_worker: MakeWorker) -> None:
    worker = await make_worker("p1", ["p1"])
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{worker.http_port}/metrics") as response:
            text = await response.text()
    exposed = set(re.findall(r"^# TYPE (\S+)", text, re.MULTILINE))
    exposed |= {name + suffix for name in exposed for suffix in ("_total", "_bucket", "_sum", "_count")}
    used = _used_metrics()
    assert {"fanout_worker_ready", "fanout_repl_lag", "fanout_persist_to_visible_seconds_bucket",
            "fanout_cache_hits_total"} <= used  # fmt: skip
    assert used <= exposed, sorted(used - exposed)
    assert "fanout_worker_ready 1.0" in text


async def test_latency_histograms_and_cache_counters_fill_under_traffic(make_worker: MakeWorker) -> None:
    """A send woken into a long-poll on another worker feeds the latency histograms; cache
    look-ups feed the hit and miss counters, all read at scrape time."""
    import asyncio

    from tests.workers.conftest import client_for
    from workers.harness.cluster_client import timeline_events

    persister = await make_worker("p1", ["p1"])
    reader = await make_worker("r1", ["p1"])
    async with aiohttp.ClientSession() as session:
        alice = client_for(session, [persister, reader], ["p1"])
        await alice.register("alice")
        room = await alice.create_room("public", via="r1")
        since = (await alice.sync("r1"))["next_batch"]
        poll = asyncio.create_task(alice.sync("r1", since, 10_000))
        await asyncio.sleep(0.3)
        await alice.send(room, "m.room.message", {"body": "x"}, via="p1")
        assert [e["content"] for e in timeline_events(await poll)] == [{"body": "x"}]
        async with session.get(f"http://127.0.0.1:{reader.http_port}/metrics") as response:
            text = await response.text()
    samples = dict(re.findall(r"^(\S+) (\S+)$", text, re.MULTILINE))
    assert float(samples["fanout_persist_to_visible_seconds_count"]) >= 1
    assert float(samples["fanout_sync_wake_seconds_count"]) >= 1
    assert float(samples["fanout_repl_commit_to_applied_seconds_count"]) >= 1
    assert float(samples['fanout_cache_misses_total{cache="rooms_for_user"}']) >= 1
    assert float(samples['fanout_cache_hits_total{cache="rooms_for_user"}']) >= 1
