"""`fanout bench cluster`: what the worker cluster sustains, beside a raw ceiling measured in the same run.

Over 500 lines: its phases share one set of servers, one report and the ceiling they are read
against, and are run in this order by `fanout bench all`.

Phases (each prints progress on stderr; the result is one JSON document plus a table). Each
phase's database is dropped when it ends: millions of rows left behind would keep autovacuum busy
on the two cores through the phases after it.

1. ceiling: plain asyncpg inserting the write path's rows (random event IDs, 16 rooms), batches of
   `--batch` events (default: the persister's largest batch): one nextval-for-n query and one
   binary COPY per batch (as the persister writes them) in a transaction, on as many connections
   at once as a persister has batches in flight, from 1 and 2 processes.
2. write path: the persisters' own code (EventPersister via an in-process Worker, publishing to
   Redis for real) driven directly by many concurrent tasks, from 1 and 2 persister processes.
   The persisters are configured as `LocalCluster` and compose deploy them (`serve_reads: false`:
   they write, and follow the other writer's positions only). With 2 persisters each round also
   runs persisters that serve reads too (each applies every row of the other), for comparison.
   Phases 1 and 2 alternate `--rounds` times (default 5); the ratio is the median of each
   round's write path / ceiling (the machine's speed drifts by 20% and more between phases,
   so one slow phase must not decide the figure).
3. HTTP: the same through `POST /rooms/{room}/send` on real worker subprocesses, 1 and 2 persisters.
4. latency: persist-to-visible on every sync worker at a fixed offered load over HTTP, seen by an
   observer in a process of its own (`visible.py`), split at the RDATA line on the channel.
5. invalidations: `--churn-members` users join a room, send and leave, over and over, through 2
   persisters over HTTP, as fast as it goes and then at the latency phase's offered rate. The
   caches-stream messages the persisters wrote are counted against the per-key invalidations they
   stand for (one per key and cache), as the demo counts them.
6. memory: the write path pushes `--rss-events` events (default 1,000,000) through a cluster while
   users long-poll a sync worker; then each worker's peak RSS (VmHWM) is read from /proc.

Targets (from the issue): write path >= 0.5 of the ceiling; a sync worker under 200 MB after
1,000,000 events; invalidation messages <= 1/10 of the per-key invalidations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from workers.config import WorkerConfig
from workers.embedded.services import given_or_embedded
from workers.handlers.rooms.persist import MAX_BATCH
from workers.handlers.sync.stored_sections import STORED_STREAMS
from workers.harness.bench._common import Figure, drop_database, progress, scratch_database
from workers.harness.bench.visible import Observer, Split
from workers.harness.bench.write_path import in_processes
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import ClusterClient
from workers.harness.load_check import invalidation_counts
from workers.process import event_loop
from workers.routing import writer_for_room
from workers.storage import connect


async def _http_load(
    cluster: LocalCluster, seconds: float, concurrency: int, rate: float | None = None
) -> tuple[int, Split | None]:
    """Send messages for `seconds` (at `rate` per second if given, observed from a process of its
    own: see `visible.py`); returns (sent, the persist-to-visible split when a rate was given)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        client = ClusterClient(session, cluster.urls, cluster.event_writers)
        await client.register(f"@bench-{uuid.uuid4().hex[:8]}")
        room_ids = [await client.create_room("public") for _ in range(4 * len(cluster.event_writers))]
        observer = None
        if rate is not None:
            observer = Observer(
                cluster.urls, cluster.event_writers, cluster.sync_workers, room_ids,
                cluster.redis_url, cluster.channel_prefix,
            )  # fmt: skip
            await observer.start()
            await asyncio.sleep(0.5)
        sent: dict[str, float] = {}
        deadline = time.monotonic() + seconds
        interval = concurrency / rate if rate else 0.0

        async def sender(index: int) -> None:
            next_at = time.monotonic()
            while time.monotonic() < deadline:
                room = room_ids[(index + len(sent)) % len(room_ids)]
                # Straight to the room's persister: the write path over HTTP, without a forwarding
                # hop (`fanout bench http` measures that hop).
                owner = writer_for_room(room, cluster.event_writers)
                result = await client.send(room, "m.room.message", {}, via=owner)
                sent[result["event_id"]] = 0.0
                if interval:
                    next_at += interval
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))

        await asyncio.gather(*(sender(i) for i in range(concurrency)))
    if observer is None:
        return len(sent), None
    await asyncio.sleep(1.0)
    arrivals = await observer.stop()
    async with connect(cluster.database_url) as conn:
        rows = await conn.fetch(
            "SELECT event_id, received_ts FROM events WHERE event_id = ANY($1)", list(sent)
        )
    received = {row["event_id"]: row["received_ts"] for row in rows}
    return len(sent), Split.of(received, arrivals, len(cluster.sync_workers))


async def _churn_load(
    cluster: LocalCluster, seconds: float, members: int, rate: float | None
) -> tuple[int, int, int]:
    """Each of `members` users joins a room, sends a message and leaves, over and over, for
    `seconds` (at `rate` events/s in all if given): two of every three events change a room's
    membership. Returns (events, caches-stream messages, per-key invalidations they stand for)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        writers = cluster.event_writers
        owner = ClusterClient(session, cluster.urls, writers)
        await owner.register(f"@churn-owner-{uuid.uuid4().hex[:8]}")
        room_ids = [await owner.create_room("public") for _ in range(4 * len(writers))]
        clients = []
        for i in range(members):
            client = ClusterClient(session, cluster.urls, writers)
            await client.register(f"@churn{i}-{uuid.uuid4().hex[:8]}")
            clients.append(client)
        async with connect(cluster.database_url) as conn:
            rows_before, per_key_before = await invalidation_counts(conn)
        events = 0
        deadline = time.monotonic() + seconds
        interval = members / rate if rate else 0.0

        async def churn(index: int, client: ClusterClient) -> None:
            nonlocal events
            next_at = time.monotonic()
            while time.monotonic() < deadline:
                room = room_ids[(index + events) % len(room_ids)]
                owner_of = writer_for_room(room, writers)
                for step in ("join", "send", "leave"):
                    if step == "send":
                        await client.send(room, "m.room.message", {}, via=owner_of)
                    else:
                        await client.membership(room, step, via=owner_of)
                    events += 1
                    if interval:
                        next_at += interval
                        await asyncio.sleep(max(0.0, next_at - time.monotonic()))

        await asyncio.gather(*(churn(i, c) for i, c in enumerate(clients)))
        async with connect(cluster.database_url) as conn:
            rows, per_key = await invalidation_counts(conn)
    return events, rows - rows_before, per_key - per_key_before


async def _invalidation_phase(
    args: argparse.Namespace, admin_url: str, redis_url: str, workdir: Path
) -> dict[str, Any]:
    """Invalidation messages against per-key invalidation, membership churn through 2 persisters
    over HTTP: as fast as it goes, and at the latency phase's offered rate."""
    found: dict[str, Any] = {}
    for label, rate in (("saturated", None), ("offered", args.rate)):
        load = "as fast as it goes" if rate is None else f"{rate:,.0f} events/s offered"
        progress(f"invalidations: join/send/leave churn over HTTP, 2 persisters, {load}")
        db = await scratch_database(admin_url, "churn")
        cluster = LocalCluster(
            db, redis_url, workdir / f"churn-{label}", persisters=2, sync_workers=0, background_workers=0,
            channel_prefix=f"bench-{uuid.uuid4().hex[:6]}", log_level="WARNING",
        )  # fmt: skip
        await cluster.start()
        try:
            events, rows, per_key = await _churn_load(cluster, args.seconds, args.churn_members, rate)
        finally:
            await cluster.stop()
            await drop_database(admin_url, db)
        found[f"invalidation_{label}"] = {
            "events_per_s": round(events / args.seconds, 1),
            "messages": rows,
            "per_key": per_key,
            "ratio": round(rows / per_key, 3) if per_key else None,
        }
        rate_seen = events / args.seconds
        progress(f"  {rows:,} messages for {per_key:,} per-key invalidations ({rate_seen:,.0f} events/s)")
    return found


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _write_phase(
    args: argparse.Namespace, admin_url: str, redis_url: str, k: int, *, serve_reads: bool
) -> float:
    """Events/s of `k` persister processes on a fresh database, driven directly for `args.seconds`."""
    db = await scratch_database(admin_url, "writepath")
    writers = [f"p{i}" for i in range(1, k + 1)]
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    try:
        count, _ = in_processes(
            "write",
            [
                (db, redis_url, prefix, w, writers, args.seconds, 0, args.concurrency, serve_reads)
                for w in writers
            ],
        )
    finally:
        await drop_database(admin_url, db)
    return float(count / args.seconds)


async def _run(args: argparse.Namespace, admin_url: str, redis_url: str, workdir: Path) -> dict[str, Any]:
    connections = args.ceiling_connections
    result: dict[str, Any] = {
        "seconds_per_phase": args.seconds,
        "batch": args.batch,
        "ceiling_connections": connections,
    }
    for k in (1, 2):
        # Ceiling and write path alternate, `--rounds` times: the machine's speed drifts between
        # phases, so each write-path phase is paired with the ceiling measured just before it.
        ceilings: list[float] = []
        writes: list[float] = []
        ratios: list[float] = []
        reading: list[float] = []  # persisters that also serve reads (2 persisters only)
        for round_no in range(1, args.rounds + 1):
            progress(
                f"ceiling: raw asyncpg batched insert from {k} process(es) (round {round_no}/{args.rounds})"
            )
            db = await scratch_database(admin_url, "ceiling")
            try:
                count, _ = in_processes(
                    "ceiling", [(db, args.seconds, args.batch, f"c{i}", connections) for i in range(k)]
                )
            finally:
                await drop_database(admin_url, db)
            ceilings.append(count / args.seconds)
            progress(
                f"write path: EventPersister driven directly, {k} persister process(es) (round {round_no})"
            )
            writes.append(await _write_phase(args, admin_url, redis_url, k, serve_reads=False))
            ratios.append(writes[-1] / ceilings[-1])
            progress(
                f"  round {round_no}: {writes[-1]:,.0f} vs {ceilings[-1]:,.0f} events/s = {ratios[-1]:.3f}"
            )
            if k > 1:
                progress(f"write path: {k} persisters that also serve reads (round {round_no})")
                reading.append(await _write_phase(args, admin_url, redis_url, k, serve_reads=True))
                progress(
                    f"  round {round_no}: {reading[-1]:,.0f} events/s = {reading[-1] / ceilings[-1]:.3f}"
                )
        result[f"ceiling_{k}"] = round(statistics.median(ceilings), 1)
        result[f"write_path_{k}"] = round(statistics.median(writes), 1)
        result[f"write_path_vs_ceiling_{k}"] = round(statistics.median(ratios), 3)
        result[f"rounds_{k}"] = [
            {"ceiling": round(c, 1), "write_path": round(w, 1), "ratio": round(r, 3)}
            for c, w, r in zip(ceilings, writes, ratios, strict=True)
        ]
        if reading:
            result[f"write_path_serving_reads_{k}"] = round(statistics.median(reading), 1)
            result[f"write_path_serving_reads_vs_ceiling_{k}"] = round(
                statistics.median([w / c for w, c in zip(reading, ceilings, strict=True)]), 3
            )
        progress(f"HTTP: POST /send on worker subprocesses, {k} persister(s)")
        db = await scratch_database(admin_url, "http")
        cluster = LocalCluster(db, redis_url, workdir / f"http{k}", persisters=k, sync_workers=0,
                               background_workers=0, channel_prefix=f"bench-{uuid.uuid4().hex[:6]}",
                               log_level="WARNING")  # fmt: skip
        await cluster.start()
        try:
            sent, _ = await _http_load(cluster, args.seconds, args.http_concurrency)
        finally:
            await cluster.stop()
            await drop_database(admin_url, db)
        result[f"http_{k}"] = round(sent / args.seconds, 1)
    progress(f"latency: {args.rate} events/s offered over HTTP, 2 persisters, 2 sync workers")
    db = await scratch_database(admin_url, "latency")
    cluster = LocalCluster(
        db, redis_url, workdir / "latency", persisters=2, sync_workers=2, background_workers=0,
        channel_prefix=f"bench-{uuid.uuid4().hex[:6]}", log_level="WARNING",
    )  # fmt: skip
    await cluster.start()
    try:
        sent, split = await _http_load(cluster, args.seconds, 8, rate=args.rate)
    finally:
        await cluster.stop()
        await drop_database(admin_url, db)
    assert split is not None
    result["latency_offered_per_s"] = args.rate
    result["latency_achieved_per_s"] = round(sent / args.seconds, 1)
    result["latency_p50_ms"], result["latency_p99_ms"] = split.total
    result["latency_to_channel_ms"] = split.to_channel
    result["latency_channel_to_visible_ms"] = split.channel_to_visible
    result["latency_samples"] = split.samples
    result.update(await _invalidation_phase(args, admin_url, redis_url, workdir))
    if args.rss_events:
        result.update(await _memory_phase(args, admin_url, redis_url, workdir))
    result["write_path_2_vs_ceiling_1"] = round(result["write_path_2"] / result["ceiling_1"], 3)
    result["target_write_path_met"] = (
        min(result["write_path_vs_ceiling_1"], result["write_path_vs_ceiling_2"]) >= 0.5
    )
    return result


async def _memory_phase(
    args: argparse.Namespace, admin_url: str, redis_url: str, workdir: Path
) -> dict[str, Any]:
    progress(f"memory: {args.rss_events:,} events through 2 persisters while users long-poll a sync worker")
    db = await scratch_database(admin_url, "memory")
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    # The write path's in-process persisters write events; the sync worker writes the user
    # streams (registering a reader creates its device there). Both sides know it.
    other_writers = {s: ["sync1"] for s in STORED_STREAMS}
    cluster = LocalCluster(
        db, redis_url, workdir / "memory", persisters=0, sync_workers=1, background_workers=0,
        channel_prefix=prefix, log_level="WARNING",
        extra_config={"stream_writers": {"events": ["p1", "p2"], **other_writers}},
    )  # fmt: skip
    await cluster.start()
    stop = asyncio.Event()
    try:
        async with aiohttp.ClientSession() as session:
            readers = []
            for i in range(8):
                reader = ClusterClient(session, cluster.urls, ["sync1"])
                await reader.register(f"@reader{i}-{uuid.uuid4().hex[:6]}", via="sync1")
                readers.append(reader)

            async def poll(reader: ClusterClient) -> None:
                token = (await reader.sync("sync1"))["next_batch"]
                while not stop.is_set():
                    token = (await reader.sync("sync1", token, 1000))["next_batch"]

            polls = [asyncio.create_task(poll(r)) for r in readers]
            per_writer = args.rss_events // 2
            started = time.monotonic()
            loop = asyncio.get_running_loop()
            count, _ = await loop.run_in_executor(
                None,
                in_processes,
                "write",
                [
                    (
                        db,
                        redis_url,
                        prefix,
                        w,
                        ["p1", "p2"],
                        10**9,
                        per_writer,
                        args.concurrency,
                        False,
                        other_writers,
                    )
                    for w in ("p1", "p2")
                ],
            )
            elapsed = time.monotonic() - started
            async with connect(db) as conn:
                rows = await conn.fetch(
                    "SELECT instance_name, max(stream_ordering) AS top FROM events GROUP BY instance_name"
                )
            tops = {r["instance_name"]: int(r["top"]) for r in rows}
            # Per writer: the first writer to finish exits, and a departed writer pins the linear
            # position (by design), so compare each writer's own position with its own last row.
            deadline = time.monotonic() + 120
            while True:
                health = await cluster.health("sync1")
                applied = {w: s["position"] for w, s in health["replication"]["streams"]["events"].items()}
                if all(applied.get(w, 0) >= top for w, top in tops.items()) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*polls, return_exceptions=True)
        spec = cluster.workers["sync1"]
        assert spec.process is not None
        rss = _peak_rss_mb(spec.process.pid)
    finally:
        await cluster.stop()
        await drop_database(admin_url, db)
    return {
        "memory_events": count,
        "memory_events_per_s": round(count / elapsed, 1),
        "sync_worker_applied": applied,
        "sync_worker_caught_up": all(applied.get(w, 0) >= top for w, top in tops.items()),
        "sync_worker_peak_rss_mb": round(rss, 1),
        "target_rss_met": rss < 200,
    }


def _table(result: dict[str, Any]) -> str:
    rows = [
        ("raw batched insert (ceiling)", result["ceiling_1"], result["ceiling_2"]),
        ("write path (EventPersister)", result["write_path_1"], result["write_path_2"]),
        ("HTTP POST /send", result["http_1"], result["http_2"]),
        ("write path / ceiling", result["write_path_vs_ceiling_1"], result["write_path_vs_ceiling_2"]),
    ]
    head = f"events/s (median of {len(result['rounds_1'])} rounds)"
    lines = [f"{head:<32}{'1 persister':>14}{'2 persisters':>14}"]
    lines += [f"{name:<32}{a:>14,}{b:>14,}" for name, a, b in rows]
    lines.append(
        "(the ceiling of each column runs as many raw processes as there are persisters; 2 persisters"
        f" against the 1-process ceiling: {result['write_path_2_vs_ceiling_1']})"
    )
    lines.append(
        "(persisters write only, as deployed; 2 persisters that also serve reads, applying each"
        f" other's rows: {result['write_path_serving_reads_2']:,} events/s,"
        f" {result['write_path_serving_reads_vs_ceiling_2']} of the ceiling)"
    )
    lines.append(
        f"persist-to-visible on every sync worker at {result['latency_offered_per_s']}/s offered "
        f"({result['latency_achieved_per_s']}/s achieved): p50 {result['latency_p50_ms']} ms, "
        f"p99 {result['latency_p99_ms']} ms ({result['latency_samples']} samples); of which persist to"
        f" the RDATA on the channel p50/p99 {result['latency_to_channel_ms']} ms, the channel to the"
        f" /sync answer {result['latency_channel_to_visible_ms']} ms"
    )
    for label in ("saturated", "offered"):
        counts = result.get(f"invalidation_{label}")
        if counts is not None:
            lines.append(
                f"invalidations, churn at {counts['events_per_s']:,} events/s ({label}):"
                f" {counts['messages']:,} messages for {counts['per_key']:,} per-key invalidations"
                f" (ratio {counts['ratio']})"
            )
    if "sync_worker_peak_rss_mb" in result:
        met = "met" if result["target_rss_met"] else "NOT met"
        lines.append(
            f"sync worker peak RSS after {result['memory_events']:,} events:"
            f" {result['sync_worker_peak_rss_mb']} MB (target < 200 MB: {met});"
            f" applied every writer's rows: {result['sync_worker_caught_up']}"
        )
    lines.append(f"write path >= 0.5 x ceiling: {'met' if result['target_write_path_met'] else 'NOT met'}")
    return "\n".join(lines)


def figures(result: dict[str, Any]) -> list[Figure]:
    """The write path beside the raw insert, HTTP beside the write path, latency and memory."""
    found: list[Figure] = []
    for k in (1, 2):
        write, ceiling = result[f"write_path_{k}"], result[f"ceiling_{k}"]
        found.append(
            Figure(
                "cluster",
                f"write path, {k} persister(s)",
                write,
                "events/s",
                ceiling,
                "ratio >= 0.5",
                result[f"write_path_vs_ceiling_{k}"] >= 0.5,
                result[f"write_path_vs_ceiling_{k}"],
            )
        )
        found.append(
            Figure(
                "cluster",
                f"HTTP send, {k} persister(s) (ceiling: the write path)",
                result[f"http_{k}"],
                "events/s",
                write,
                "ratio >= 0.25",
                result[f"http_{k}"] >= 0.25 * write,
            )
        )
    offered = f"{result['latency_offered_per_s']:,.0f}/s offered"
    found.append(
        Figure(
            "cluster",
            f"persist-to-visible p50, {offered}",
            result["latency_p50_ms"],
            "ms",
            None,
            "<= 5 ms",
            result["latency_p50_ms"] <= 5,
        )
    )
    found.append(
        Figure(
            "cluster",
            f"persist-to-visible p99, {offered}",
            result["latency_p99_ms"],
            "ms",
            None,
            "<= 20 ms",
            result["latency_p99_ms"] <= 20,
        )
    )
    halves = (("persist to its RDATA on the channel", "latency_to_channel_ms"),
              ("the channel to the /sync answer", "latency_channel_to_visible_ms"))  # fmt: skip
    for half, key in halves:
        for i, p in enumerate(("p50", "p99")):
            found.append(Figure("cluster", f"of which {half}, {p}", result[key][i], "ms"))
    for label, load in (("saturated", "as fast as it goes"), ("offered", offered)):
        counts = result.get(f"invalidation_{label}")
        if counts is None or counts["ratio"] is None:
            continue
        found.append(
            Figure(
                "cluster",
                f"invalidation messages, join/leave churn at {counts['events_per_s']:,.0f} events/s ({load})"
                " (ceiling: per-key invalidations)",
                counts["messages"],
                "messages",
                counts["per_key"],
                "ratio <= 0.1",
                counts["ratio"] <= 0.1,
                counts["ratio"],
            )
        )
    if "sync_worker_peak_rss_mb" in result:
        found.append(
            Figure(
                "cluster",
                f"sync worker peak RSS after {result['memory_events']:,} events",
                result["sync_worker_peak_rss_mb"],
                "MB",
                None,
                "< 200 MB",
                result["target_rss_met"],
            )
        )
    return found


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout bench cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", help="an admin URL (benchmark databases are created on it)")
    p.add_argument("--redis-url")
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput phase")
    p.add_argument(
        "--rounds", type=int, default=5,
        help="ceiling/write-path pairs per persister count; the table shows medians",
    )  # fmt: skip
    p.add_argument(
        "--batch", type=int, default=MAX_BATCH,
        help="events per batch in the ceiling (default: the persister's largest batch)",
    )  # fmt: skip
    p.add_argument(
        "--ceiling-connections", type=int,
        default=WorkerConfig.model_fields["persist_batches_in_flight"].default,
        help="connections inserting at once per ceiling process (default: a persister's batches in flight)",
    )  # fmt: skip
    p.add_argument(
        "--concurrency", type=int, default=1024,
        help="concurrent senders per persister on the write path (enough to keep its batches in flight full)",
    )  # fmt: skip
    p.add_argument("--http-concurrency", type=int, default=256, help="concurrent HTTP senders")
    p.add_argument("--rate", type=float, default=1000.0, help="offered events/s in the latency phase")
    p.add_argument(
        "--churn-members", type=int, default=64,
        help="users joining, sending and leaving at once in the invalidation phase",
    )  # fmt: skip
    p.add_argument("--rss-events", type=int, default=1_000_000, help="events for the memory phase (0: skip)")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="fanout-bench-cluster-"))
    with given_or_embedded(args.database_url, args.redis_url) as (admin_url, redis_url):
        result = event_loop.run(_run(args, admin_url, redis_url, workdir))
    print(json.dumps(result, indent=2))
    print(_table(result))
    return 0
