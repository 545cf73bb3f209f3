"""The dashboard's series on worker processes: after real traffic through a persister and a sync
worker (subprocesses), every series the dashboard and the alert rules read is on their /metrics,
and the replication stages, /sync by kind, cache hits and misses and named transactions have
counted what happened."""

from __future__ import annotations

import asyncio
import re

import aiohttp

from tests.cluster.conftest import MakeCluster
from tests.compose.test_observability import CACHES, used_metrics
from workers.harness.cluster_client import ClusterClient, timeline_events


async def test_every_dashboard_series_is_fed_on_worker_processes(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(
        persisters=1, sync_workers=1, background_workers=0, extra_config={"db_slow_transaction_s": 1e-6}
    )
    async with aiohttp.ClientSession() as session:
        alice = ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        room = await alice.create_room("public", via="sync1")
        await alice.send(room, "m.room.message", {"body": "before"}, via="persister1")
        for _ in range(200):  # initial syncs until the sync worker has applied "before"
            initial = await alice.sync("sync1")
            if {"body": "before"} in [e["content"] for e in timeline_events(initial)]:
                break
            await asyncio.sleep(0.05)
        poll = asyncio.create_task(alice.sync("sync1", initial["next_batch"], 10_000))
        await asyncio.sleep(0.3)
        await alice.send(room, "m.room.message", {"body": "x"}, via="persister1")
        woken = await poll
        assert [e["content"] for e in timeline_events(woken)] == [{"body": "x"}]
        assert timeline_events(await alice.sync("sync1", initial["next_batch"]))
        await alice.sync("sync1", woken["next_batch"], 300)
        texts = {}
        for name in ("persister1", "sync1"):
            async with session.get(f"{cluster.url(name)}/metrics") as resp:
                texts[name] = await resp.text()
    exposed = {n for t in texts.values() for n in re.findall(r"^# TYPE (\S+)", t, re.MULTILINE)}
    exposed |= {name + suffix for name in exposed for suffix in ("_total", "_bucket", "_sum", "_count")}
    assert used_metrics() <= exposed, sorted(used_metrics() - exposed)
    sync = dict(re.findall(r"^(\S+) (\S+)$", texts["sync1"], re.MULTILINE))
    assert float(sync['fanout_repl_received_to_applied_seconds_count{stream="events"}']) >= 2
    assert float(sync['fanout_repl_applied_to_woken_seconds_count{stream="events"}']) >= 1
    for kind in ("initial", "incremental", "woken", "timeout"):
        assert float(sync[f'fanout_sync_seconds_count{{kind="{kind}"}}']) >= 1, kind
    labelled = set(re.findall(r'^fanout_cache_hits_total\{cache="([^"]+)"\}', texts["sync1"], re.MULTILINE))
    assert CACHES <= labelled, sorted(CACHES - labelled)
    assert float(sync['fanout_cache_hits_total{cache="recent_events"}']) >= 1
    assert float(sync['fanout_cache_misses_total{cache="event_bodies"}']) >= 1
    persister = dict(re.findall(r"^(\S+) (\S+)$", texts["persister1"], re.MULTILINE))
    lane = 'name="idgen.multi_writer.MultiWriterIdGenerator._allocate"'
    assert float(persister[f"fanout_db_transaction_seconds_count{{{lane}}}"]) >= 2
    assert float(persister[f"fanout_db_slow_transactions_total{{{lane}}}"]) >= 2
