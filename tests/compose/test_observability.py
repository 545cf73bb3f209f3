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


def used_metrics() -> set[str]:
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
    used = used_metrics()
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


#: The in-process caches a sync worker reports, by their `cache` label.
CACHES = {
    "rooms_for_user", "joined_members", "current_state", "room_visibility", "get_user_by_access_token",
    "room_rules", "room_memberships", "room_versions", "instance_map", "event_bodies", "recent_events",
    "sync_tokens", "filter_type_patterns", "sync_filters", "inline_sync_filters", "presence_changes",
    "account_data_changes", "device_lists_changes", "to_device_changes", "receipts_changes",
}  # fmt: skip


async def test_the_stage_kind_cache_and_transaction_series_fill_on_a_real_worker(
    make_worker: MakeWorker,
) -> None:
    """What the dashboard's newer panels read, each from a sync worker's /metrics after real traffic:
    the replication stages of the events stream, /sync by kind (initial, incremental, woken,
    timeout), hits and misses of every cache, and slow transactions (every one, at a threshold of
    a microsecond) by name."""
    import asyncio

    from tests.workers.conftest import client_for
    from workers.harness.cluster_client import timeline_events

    persister = await make_worker("p1", ["p1"])
    reader = await make_worker("r1", ["p1"], db_slow_transaction_s=1e-6)
    async with aiohttp.ClientSession() as session:
        alice = client_for(session, [persister, reader], ["p1"])
        await alice.register("alice")
        room = await alice.create_room("public", via="r1")
        await alice.send(room, "m.room.message", {"body": "before"}, via="p1")
        for _ in range(100):  # initial syncs until the reader has applied "before"
            initial = await alice.sync("r1")
            if {"body": "before"} in [e["content"] for e in timeline_events(initial)]:
                break
            await asyncio.sleep(0.05)
        since = initial["next_batch"]
        poll = asyncio.create_task(alice.sync("r1", since, 10_000))
        await asyncio.sleep(0.3)
        await alice.send(room, "m.room.message", {"body": "x"}, via="p1")
        woken = await poll  # woken
        assert [e["content"] for e in timeline_events(woken)] == [{"body": "x"}]
        assert timeline_events(await alice.sync("r1", since))  # incremental: the same window again
        await alice.sync("r1", woken["next_batch"], 300)  # timeout: nothing new for 0.3 s
        async with session.get(f"http://127.0.0.1:{reader.http_port}/metrics") as response:
            text = await response.text()
    samples = {key: float(value) for key, value in re.findall(r"^(\S+) (\S+)$", text, re.MULTILINE)}
    events = '{stream="events"}'
    assert samples[f"fanout_repl_received_to_applied_seconds_count{events}"] >= 2
    assert samples[f"fanout_repl_applied_to_woken_seconds_count{events}"] >= 1
    for kind in ("initial", "incremental", "woken", "timeout"):
        assert samples[f'fanout_sync_seconds_count{{kind="{kind}"}}'] >= 1, kind
    assert samples['fanout_sync_seconds_bucket{kind="timeout",le="0.25"}'] == 0  # it waited 0.3 s
    labelled = set(re.findall(r'^fanout_cache_hits_total\{cache="([^"]+)"\}', text, re.MULTILINE))
    assert CACHES <= labelled, sorted(CACHES - labelled)
    for cache in ("sync_tokens", "event_bodies", "recent_events", "inline_sync_filters"):
        assert samples[f'fanout_cache_hits_total{{cache="{cache}"}}'] >= 1, cache
        assert f'fanout_cache_misses_total{{cache="{cache}"}}' in samples, cache
    assert samples['fanout_cache_misses_total{cache="event_bodies"}'] >= 1  # the first read of "x"
    assert sum(v for k, v in samples.items() if k.startswith("fanout_cache_hits_total") and "_changes" in k)
    slow = set(re.findall(r'^fanout_db_slow_transactions_total\{name="([^"]+)"\}', text, re.MULTILINE))
    assert {
        "workers.storage.migrate.apply_migrations",
        "workers.process.reachability.PostgresProbe._run",
    } <= slow
    assert not [name for name in slow if name.startswith("asyncio.")]  # a task hid where it was opened
