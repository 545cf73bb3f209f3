"""`fanout bench pubsub`: replication throughput and latency beside the raw redis-py ceiling.

One writer (this process) and 1, 4 and 16 subscribers, each subscriber in its own process as in a
real cluster (one subscriber per worker process). The raw ceiling uses the very same layout: the
same subscriber processes run a bare redis-py raw-reply read loop while this process PUBLISHes
(pipelined); then they run a `ReplicationClient` each while this process writes through one.
* throughput: the writer sends N rows as fast as it can; rows/s until every subscriber got all;
* latency at a fixed rate (default 2,000 rows/s): publish-to-received (raw) and
  stage-to-applied (ours) p50/p99, over every row of every subscriber (CLOCK_MONOTONIC is
  shared by the processes).
Also measured: wire encode/decode speed. The generator is in memory: this measures pubsub, not
Postgres (the catch-up path is covered by the tests). Prints JSON, then a table; progress on stderr.

Targets: >= 50% of the raw throughput; p99 <= raw p99 + 2 ms at 2,000 rows/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from pubsub.client import ReplicationClient
from pubsub.streams import Stream
from pubsub.wire import Position, RData, format_command, parse_line
from workers.harness.bench._common import Figure, percentile, progress
from workers.harness.bench.pubsub_subscribers import (
    STREAM,
    WRITER,
    BenchRow,
    JobResult,
    SubscriberPool,
    no_rows,
    settings,
)
from workers.harness.memory import MemoryGenerator
from workers.process import event_loop

# -- raw redis-py ceiling --------------------------------------------------------------------------


async def _raw_run(
    pool: SubscriberPool, url: str, subs: int, total: int, rate: float | None, body: str, channel: str
) -> dict[str, Any]:
    await pool.start_jobs([("raw", url, channel, i, total) for i in range(subs)])
    sent_at = [math.nan] * total
    pub = aioredis.Redis.from_url(url, protocol=2)
    start = time.perf_counter()
    await _drive(total, rate, lambda batch: _raw_publish(pub, channel, batch, body, sent_at))
    results = await pool.results(subs)
    await pub.aclose()
    return _result(total, start, sent_at, results, rate is not None)


async def _raw_publish(
    pub: aioredis.Redis, channel: str, batch: range, body: str, sent_at: list[float]
) -> None:
    pipe = pub.pipeline(transaction=False)
    now = time.perf_counter()
    for n in batch:
        sent_at[n - 1] = now
        pipe.publish(channel, f"{n} {body}")
    await pipe.execute()


async def _drive(total: int, rate: float | None, send: Callable[[range], Any]) -> None:
    """Send `total` items: in batches of 500 as fast as possible, or at `rate` per second in 5 ms ticks."""
    if rate is None:
        for first in range(1, total + 1, 500):
            await send(range(first, min(total, first + 499) + 1))
        return
    per_tick = max(1, round(rate * 0.005))
    start = time.perf_counter()
    sent = 0
    while sent < total:
        batch = range(sent + 1, min(total, sent + per_tick) + 1)
        await send(batch)
        sent = batch[-1]
        delay = start + sent / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


def _result(
    total: int, start: float, sent_at: list[float], results: list[JobResult], timed: bool
) -> dict[str, Any]:
    received = [r["received"] for r in results]
    out: dict[str, Any] = {"complete": all(n >= total for n in received)}
    if not out["complete"]:
        out["missing_rows"] = sum(total - n for n in received)
    dropped: dict[str, int] = {}
    for r in results:
        for reason, count in r.get("dropped", {}).items():
            dropped[reason] = dropped.get(reason, 0) + count
    if dropped:
        out["dropped_by_subscribers"] = dropped
    finished = max((t for r in results for t in r["arrivals"] if not math.isnan(t)), default=math.nan)
    elapsed = finished - start
    out["rows_per_s"] = round(total / elapsed, 1) if out["complete"] else 0.0
    out["seconds"] = round(elapsed, 3)
    if timed:
        latencies = [
            t - s for r in results for t, s in zip(r["arrivals"], sent_at, strict=True) if not math.isnan(t)
        ]
        out["p50_ms"] = round(percentile(latencies, 50) * 1000, 3)
        out["p99_ms"] = round(percentile(latencies, 99) * 1000, 3)
    return out


# -- pubsub replication ---------------------------------------------------------------------------


async def _pubsub_run(
    pool: SubscriberPool, url: str, subs: int, total: int, rate: float | None, body: str, prefix: str
) -> dict[str, Any]:
    sent_at = [math.nan] * total
    writer_gen = MemoryGenerator()
    writer_stream = Stream(STREAM, BenchRow, no_rows, writer_gen, [WRITER])
    writer = ReplicationClient(settings(WRITER, url, prefix), [writer_stream], read=[])
    await writer.start()
    try:
        await pool.start_jobs([("ours", url, prefix, i, total) for i in range(subs)])

        async def send(batch: range) -> None:
            now = time.perf_counter()
            for n in batch:
                sent_at[n - 1] = now
            writer.stage_rows(STREAM, [(n, BenchRow(n=n, body=body)) for n in batch])
            writer_gen.positions[WRITER] = batch[-1]
            writer.notify(STREAM)
            await asyncio.sleep(0)

        start = time.perf_counter()
        await _drive(total, rate, send)
        results = await pool.results(subs)
    finally:
        await writer.stop()
    return _result(total, start, sent_at, results, rate is not None)


# -- wire codec -----------------------------------------------------------------------------------


def _codec(body: str) -> dict[str, float]:
    stream = Stream(STREAM, BenchRow, no_rows, MemoryGenerator(), ["writer"])
    row = BenchRow(n=1, body=body)
    rdata = RData(STREAM, "writer", 12345, stream.encode_payload(row, 12344, 1))
    line = format_command(rdata).encode()
    position = Position(STREAM, "writer", 12344, 12345)
    results: dict[str, float] = {}

    def measure(name: str, fn: Callable[[], object], n: int = 50_000) -> None:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        results[name] = round(n / (time.perf_counter() - start))

    measure("format_rdata_ops_per_s", lambda: format_command(rdata))
    measure("parse_rdata_ops_per_s", lambda: parse_line(line))
    measure("format_position_ops_per_s", lambda: format_command(position))
    measure("encode_row_payload_ops_per_s", lambda: stream.encode_payload(row, 12344, 1))
    measure("validate_row_payload_ops_per_s", lambda: stream.parse_payload(rdata.row_json, True))
    return results


async def _bench(args: argparse.Namespace, url: str) -> dict[str, Any]:
    body = "x" * args.row_bytes
    report: dict[str, Any] = {
        "row_bytes": args.row_bytes,
        "rate_rows_per_s": args.rate,
        "layout": "writer in the bench process, one process per subscriber (raw and ours alike)",
        "runs": [],
    }
    progress("wire codec ...")
    report["codec"] = _codec(body)
    progress(f"starting {max(args.subscribers)} subscriber processes ...")
    pool = SubscriberPool(max(args.subscribers))
    try:
        prefix = f"bench-{int(time.time())}"
        for subs in args.subscribers:
            report["runs"].append(await _one_count(args, pool, url, subs, body, f"{prefix}-{subs}"))
    finally:
        pool.close()
    return report


async def _one_count(
    args: argparse.Namespace, pool: SubscriberPool, url: str, subs: int, body: str, prefix: str
) -> dict[str, Any]:
    total = args.rows
    lat_total = int(args.rate * args.latency_seconds)
    entry: dict[str, Any] = {"subscribers": subs, "throughput_rows": total, "latency_rows": lat_total}
    progress(f"{subs} subscriber(s): raw throughput ({total} rows) ...")
    entry["raw"] = await _raw_run(pool, url, subs, total, None, body, f"{prefix}-raw-t")
    progress(f"{subs} subscriber(s): pubsub throughput ({total} rows) ...")
    entry["pubsub"] = await _pubsub_run(pool, url, subs, total, None, body, f"{prefix}-t")
    progress(f"{subs} subscriber(s): latency at {args.rate:.0f} rows/s for {args.latency_seconds:.0f} s ...")
    raw_lat = await _raw_run(pool, url, subs, lat_total, args.rate, body, f"{prefix}-raw-l")
    ours_lat = await _pubsub_run(pool, url, subs, lat_total, args.rate, body, f"{prefix}-l")
    for side, lat in (("raw", raw_lat), ("pubsub", ours_lat)):
        entry[side].update({k: v for k, v in lat.items() if k.endswith("_ms")})
        entry[side]["latency_complete"] = lat["complete"]
    raw, ours = entry["raw"], entry["pubsub"]
    entry["throughput_ratio"] = round(ours["rows_per_s"] / raw["rows_per_s"], 3) if raw["rows_per_s"] else 0.0
    entry["p99_over_raw_ms"] = round(ours["p99_ms"] - raw["p99_ms"], 3)
    entry["throughput_target_met"] = entry["throughput_ratio"] >= 0.5
    entry["latency_target_met"] = bool(ours["latency_complete"]) and entry["p99_over_raw_ms"] <= 2.0
    entry["meets_targets"] = entry["throughput_target_met"] and entry["latency_target_met"]
    progress(
        f"  ratio {entry['throughput_ratio']:.2f}, p99 {ours['p99_ms']:.2f} ms vs raw {raw['p99_ms']:.2f} ms"
    )
    return entry


def _table(report: dict[str, Any]) -> str:
    head = f"{'subs':>4} | {'raw rows/s':>10} {'ours rows/s':>11} {'ratio':>6} {'>=0.5':>5} | "
    head += f"{'raw p50':>8} {'raw p99':>8} {'our p50':>8} {'our p99':>8} {'+ms':>6} {'<=2':>4} (ms)"
    lines = [head, "-" * len(head)]
    for e in report["runs"]:
        raw, ours = e["raw"], e["pubsub"]
        rates = f"{raw['rows_per_s']:>10.0f} {ours['rows_per_s']:>11.0f} {e['throughput_ratio']:>6.2f}"
        rates += f" {'yes' if e['throughput_target_met'] else 'NO':>5}"
        times = f"{raw['p50_ms']:>8.2f} {raw['p99_ms']:>8.2f} {ours['p50_ms']:>8.2f} {ours['p99_ms']:>8.2f}"
        times += f" {e['p99_over_raw_ms']:>6.2f} {'yes' if e['latency_target_met'] else 'NO':>4}"
        lines.append(f"{e['subscribers']:>4} | {rates} | {times}")
        for side in ("raw", "pubsub"):
            if not e[side]["complete"] or not e[side]["latency_complete"]:
                lines.append(f"     {side}: rows missing (see JSON): figures of that side are not valid")
    met = all(e["meets_targets"] for e in report["runs"])
    lines.append(f"targets met for every subscriber count: {'yes' if met else 'NO'}")
    lines.append("codec (ops/s): " + ", ".join(f"{k}={v:,.0f}" for k, v in report["codec"].items()))
    return "\n".join(lines)


def figures(report: dict[str, Any]) -> list[Figure]:
    """Replication beside raw redis-py: throughput and p99 latency per subscriber count."""
    found: list[Figure] = []
    for e in report["runs"]:
        raw, ours, subs = e["raw"], e["pubsub"], e["subscribers"]
        found.append(
            Figure(
                "pubsub",
                f"throughput, {subs} subscriber(s)",
                ours["rows_per_s"],
                "rows/s",
                raw["rows_per_s"],
                "ratio >= 0.5",
                e["throughput_target_met"],
            )
        )
        found.append(
            Figure(
                "pubsub",
                f"p99 at {report['rate_rows_per_s']:,.0f} rows/s, {subs} subscriber(s)",
                ours["p99_ms"],
                "ms",
                raw["p99_ms"],
                "<= ceiling + 2 ms",
                e["latency_target_met"],
            )
        )
    return found


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout bench pubsub", description=__doc__.split("\n")[0])
    p.add_argument("--redis-url", help="default: start an embedded valkey-server for the run")
    p.add_argument("--subscribers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16])
    p.add_argument(
        "--rows", type=int, default=40_000,
        help="rows of each throughput run (whatever the subscriber count: shorter runs with 16"
        " processes on a few cores measure the scheduler more than the code)",
    )  # fmt: skip
    p.add_argument("--rate", type=float, default=2000.0, help="rows/s of the latency runs")
    p.add_argument("--latency-seconds", type=float, default=3.0)
    p.add_argument("--row-bytes", type=int, default=150)
    args = p.parse_args(argv)
    if args.redis_url:
        report = event_loop.run(_bench(args, args.redis_url))
    else:
        from workers.embedded.services import EmbeddedServices

        with EmbeddedServices(with_postgres=False) as services:
            report = event_loop.run(_bench(args, services.redis_url))
    print(json.dumps(report, indent=2))
    print(_table(report))
    return 0 if all(e["meets_targets"] for e in report["runs"]) else 1
