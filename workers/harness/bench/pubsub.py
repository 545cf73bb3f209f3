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

Targets (issue 4): >= 50% of the raw throughput; p99 <= raw p99 + 2 ms at 2,000 rows/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import redis.asyncio as aioredis

from pubsub.client import ReplicationClient, ReplicationSettings
from pubsub.redis_transport import SUBSCRIBER_READ_BYTES
from pubsub.streams import Stream
from pubsub.wire import Position, RData, format_command, parse_line
from workers import event_loop
from workers.gc_tuning import tune_gc
from workers.harness.bench._common import Figure, percentile, progress
from workers.harness.memory import MemoryGenerator

STREAM = "bench"
WRITER = "writer"
JOB_TIMEOUT_S = 60.0


class BenchRow(NamedTuple):
    n: int
    body: str


async def _no_rows(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, Any]]:
    return []


def _settings(name: str, url: str, prefix: str) -> ReplicationSettings:
    return ReplicationSettings(name, url, channel_prefix=prefix, announce_interval_s=1.0, queue_size=200_000)


# -- subscriber processes ---------------------------------------------------------------------------

#: (kind "raw" | "ours", redis url, channel (raw) or channel prefix (ours), subscriber index, rows)
Job = tuple[str, str, str, int, int]
#: {"received": int, "arrivals": [perf_counter() per row n-1, NaN when not received]}
JobResult = dict[str, Any]


def _subscriber_main(conn: Connection) -> None:
    """Body of one subscriber process: run the jobs the parent sends until it sends None."""
    tune_gc()  # as in a worker process (raw and ours run in this same process)
    while True:
        job: Job | None = conn.recv()
        if job is None:
            return
        kind, url, name, index, total = job
        runner = _raw_subscriber if kind == "raw" else _our_subscriber
        conn.send(event_loop.run(runner(conn, url, name, index, total)))


async def _raw_subscriber(conn: Connection, url: str, channel: str, index: int, total: int) -> JobResult:
    """The ceiling: redis-py's raw-reply read loop, no parsing beyond the row number, with the
    transport's socket read size (which saves hiredis most of its buffer copying)."""
    arrivals = [math.nan] * total
    received = 0
    clock = time.perf_counter
    client = aioredis.Redis.from_url(url, protocol=2, socket_read_size=SUBSCRIBER_READ_BYTES)
    p = client.pubsub()
    await p.subscribe(channel)
    await p.parse_response(block=True)  # the subscribe confirmation
    conn.send("ready")

    async def read() -> None:
        nonlocal received
        while received < total:
            reply = await p.parse_response(block=True)
            if reply[0] == b"message":
                arrivals[int(reply[2].split(b" ", 1)[0]) - 1] = clock()
                received += 1

    try:
        await asyncio.wait_for(read(), JOB_TIMEOUT_S)
    except TimeoutError:
        pass
    await p.aclose()  # type: ignore[no-untyped-call]
    await client.aclose()
    return {"received": received, "arrivals": arrivals}


async def _our_subscriber(conn: Connection, url: str, prefix: str, index: int, total: int) -> JobResult:
    """A `ReplicationClient` reading the bench stream; `apply` notes when each row arrived."""
    arrivals = [math.nan] * total
    applied = 0
    done = asyncio.Event()
    clock = time.perf_counter

    async def apply(stream: Stream[Any], instance: str, token: int, rows: Sequence[Any]) -> None:
        nonlocal applied
        now = clock()
        for row in rows:
            arrivals[row.n - 1] = now
        applied += len(rows)
        if applied >= total:
            done.set()

    stream = Stream(STREAM, BenchRow, _no_rows, MemoryGenerator(), [WRITER])
    client = ReplicationClient(_settings(f"reader{index}", url, prefix), [stream], apply=apply)
    await client.start()
    deadline = time.monotonic() + 30
    while not client.handler.is_connected(STREAM, WRITER):
        if time.monotonic() > deadline:
            raise RuntimeError("subscriber did not connect to the writer within 30 s")
        await asyncio.sleep(0.005)
    conn.send("ready")
    try:
        await asyncio.wait_for(done.wait(), JOB_TIMEOUT_S)
    except TimeoutError:
        pass
    dropped = {reason: count for (reason,), count in client.metrics.dropped.items()}
    try:
        await asyncio.wait_for(client.stop(), 10)
    except TimeoutError:
        dropped["bench_stop_timed_out"] = 1
    return {"received": applied, "arrivals": arrivals, "dropped": dropped}


class _SubscriberPool:
    """Subscriber processes, started once (spawn: no inherited event loop) and reused by every run."""

    def __init__(self, count: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        for _ in range(count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_subscriber_main, args=(child,), daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)

    async def _recv(self, conn: Connection, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while not conn.poll():
            if time.monotonic() > deadline:
                raise RuntimeError("a subscriber process did not answer in time")
            await asyncio.sleep(0.002)
        return conn.recv()

    async def start_jobs(self, jobs: Sequence[Job]) -> None:
        """Send one job per process and wait until each is subscribed (and, for ours, connected)."""
        for conn, job in zip(self._conns, jobs, strict=False):
            conn.send(job)
        for conn in self._conns[: len(jobs)]:
            ready = await self._recv(conn, 90)
            if ready != "ready":
                raise RuntimeError(f"subscriber process failed to start: {ready!r}")

    async def results(self, count: int) -> list[JobResult]:
        return [await self._recv(conn, JOB_TIMEOUT_S + 30) for conn in self._conns[:count]]

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


# -- raw redis-py ceiling --------------------------------------------------------------------------


async def _raw_run(
    pool: _SubscriberPool, url: str, subs: int, total: int, rate: float | None, body: str, channel: str
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
    pool: _SubscriberPool, url: str, subs: int, total: int, rate: float | None, body: str, prefix: str
) -> dict[str, Any]:
    sent_at = [math.nan] * total
    writer_gen = MemoryGenerator()
    writer_stream = Stream(STREAM, BenchRow, _no_rows, writer_gen, [WRITER])
    writer = ReplicationClient(_settings(WRITER, url, prefix), [writer_stream], read=[])
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
    stream = Stream(STREAM, BenchRow, _no_rows, MemoryGenerator(), ["writer"])
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
    pool = _SubscriberPool(max(args.subscribers))
    try:
        prefix = f"bench-{int(time.time())}"
        for subs in args.subscribers:
            report["runs"].append(await _one_count(args, pool, url, subs, body, f"{prefix}-{subs}"))
    finally:
        pool.close()
    return report


async def _one_count(
    args: argparse.Namespace, pool: _SubscriberPool, url: str, subs: int, body: str, prefix: str
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
        from workers.services import EmbeddedServices

        with EmbeddedServices(with_postgres=False) as services:
            report = event_loop.run(_bench(args, services.redis_url))
    print(json.dumps(report, indent=2))
    print(_table(report))
    return 0 if all(e["meets_targets"] for e in report["runs"]) else 1
