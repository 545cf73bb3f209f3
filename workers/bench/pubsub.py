"""`fanout bench pubsub`: replication throughput and latency beside the raw redis-py ceiling.

For 1, 4 and 16 subscribers (all in this process, like the raw ceiling, so the comparison is fair):
* throughput: one writer publishes N rows as fast as it can; rows/s until every subscriber applied all;
* latency at a fixed rate (default 2,000 rows/s): publish-to-applied p50/p99.
The raw ceiling does the same with bare PUBLISH (pipelined) and a bare raw-reply read loop.
Also measured: wire encode/decode speed. The generator is in memory: this measures pubsub, not
Postgres (the catch-up path is covered by the tests). Prints JSON, then a table; progress on stderr.

Targets (issue 4): >= 50% of the raw throughput; p99 <= raw p99 + 2 ms at 2,000 rows/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

from pubsub.client import ReplicationClient, ReplicationSettings
from pubsub.streams import Stream
from pubsub.wire import Position, RData, format_command, parse_line

STREAM = "bench"


class BenchRow(BaseModel):
    n: int
    body: str


class _MemoryGenerator:
    """Positions in memory; `own` is the writer's last finished token."""

    def __init__(self) -> None:
        self.positions: dict[str, int] = {}

    def get_current_token_for_writer(self, instance_name: str) -> int:
        return self.positions.get(instance_name, 0)

    def advance(self, instance_name: str, new_id: int) -> None:
        if new_id > self.positions.get(instance_name, 0):
            self.positions[instance_name] = new_id

    def get_positions(self) -> dict[str, int]:
        return dict(self.positions)


async def _no_rows(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, Any]]:
    return []


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- raw redis-py ceiling --------------------------------------------------------------------------


async def _raw_run(
    url: str, subs: int, total: int, rate: float | None, body: str, prefix: str
) -> dict[str, float]:
    channel = f"{prefix}-raw"
    received = [0] * subs
    latencies: list[float] = []
    sent_at: dict[int, float] = {}
    done = asyncio.Event()
    clients = [aioredis.Redis.from_url(url, protocol=2) for _ in range(subs)]
    pubsubs = [c.pubsub() for c in clients]
    for p in pubsubs:
        await p.subscribe(channel)
        await p.parse_response(block=True)  # the subscribe confirmation

    async def reader(i: int, p: Any) -> None:
        while received[i] < total:
            reply = await p.parse_response(block=True)
            if reply[0] == b"message":
                data = reply[2]
                received[i] += 1
                if rate is not None:
                    latencies.append(time.perf_counter() - sent_at[int(data.split(b" ", 1)[0])])
        if all(r >= total for r in received):
            done.set()

    tasks = [asyncio.create_task(reader(i, p)) for i, p in enumerate(pubsubs)]
    pub = aioredis.Redis.from_url(url, protocol=2)
    start = time.perf_counter()
    await _drive(total, rate, lambda batch: _raw_publish(pub, channel, batch, body, sent_at))
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - start
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for p in pubsubs:
        await p.aclose()  # type: ignore[no-untyped-call]
    for c in [*clients, pub]:
        await c.aclose()
    return _result(total, elapsed, latencies)


async def _raw_publish(
    pub: aioredis.Redis, channel: str, batch: range, body: str, sent_at: dict[int, float]
) -> None:
    pipe = pub.pipeline(transaction=False)
    now = time.perf_counter()
    for n in batch:
        sent_at[n] = now
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


def _result(total: int, elapsed: float, latencies: list[float]) -> dict[str, float]:
    out = {"rows_per_s": round(total / elapsed, 1), "seconds": round(elapsed, 3)}
    if latencies:
        out["p50_ms"] = round(_pct(latencies, 0.50) * 1000, 3)
        out["p99_ms"] = round(_pct(latencies, 0.99) * 1000, 3)
    return out


# -- pubsub replication ---------------------------------------------------------------------------


async def _pubsub_run(
    url: str, subs: int, total: int, rate: float | None, body: str, prefix: str
) -> dict[str, float]:
    sent_at: dict[int, float] = {}
    latencies: list[float] = []
    applied = [0] * subs
    done = asyncio.Event()

    def make_apply(i: int) -> Any:
        async def apply(stream: Stream[Any], instance: str, token: int, rows: Sequence[BaseModel]) -> None:
            applied[i] += len(rows)
            if rate is not None:
                latencies.append(time.perf_counter() - sent_at[token])
            if applied[i] >= total and all(a >= total for a in applied):
                done.set()

        return apply

    def settings(name: str) -> ReplicationSettings:
        return ReplicationSettings(
            name, url, channel_prefix=prefix, announce_interval_s=1.0, queue_size=200_000
        )

    writer_gen = _MemoryGenerator()
    writer_stream = Stream(STREAM, BenchRow, _no_rows, writer_gen, ["writer"])
    writer = ReplicationClient(settings("writer"), [writer_stream], read=[])
    readers = []
    for i in range(subs):
        stream = Stream(STREAM, BenchRow, _no_rows, _MemoryGenerator(), ["writer"])
        readers.append(ReplicationClient(settings(f"reader{i}"), [stream], apply=make_apply(i)))
    for client in [writer, *readers]:
        await client.start()
    deadline = time.monotonic() + 30
    while not all(r.handler.is_connected(STREAM, "writer") for r in readers):
        if time.monotonic() > deadline:
            raise RuntimeError("subscribers did not connect within 30 s")
        await asyncio.sleep(0.01)

    async def send(batch: range) -> None:
        now = time.perf_counter()
        for n in batch:
            sent_at[n] = now
            writer.stage_rows(STREAM, n, [BenchRow(n=n, body=body)])
        writer_gen.positions["writer"] = batch[-1]
        writer.notify(STREAM)
        await asyncio.sleep(0)

    start = time.perf_counter()
    await _drive(total, rate, send)
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - start
    for client in [writer, *readers]:
        await client.stop()
    return _result(total, elapsed, latencies)


# -- wire codec -----------------------------------------------------------------------------------


def _codec(body: str) -> dict[str, float]:
    stream = Stream(STREAM, BenchRow, _no_rows, _MemoryGenerator(), ["writer"])
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
    report: dict[str, Any] = {"row_bytes": args.row_bytes, "rate_rows_per_s": args.rate, "runs": []}
    _progress("wire codec ...")
    report["codec"] = _codec(body)
    prefix = f"bench-{int(time.time())}"
    for subs in args.subscribers:
        total = max(2000, args.rows // subs)
        lat_total = int(args.rate * args.latency_seconds)
        entry: dict[str, Any] = {"subscribers": subs}
        _progress(f"{subs} subscriber(s): raw throughput ({total} rows) ...")
        entry["raw"] = await _raw_run(url, subs, total, None, body, prefix)
        _progress(f"{subs} subscriber(s): pubsub throughput ...")
        entry["pubsub"] = await _pubsub_run(url, subs, total, None, body, f"{prefix}-{subs}-t")
        _progress(f"{subs} subscriber(s): latency at {args.rate:.0f} rows/s ...")
        raw_lat = await _raw_run(url, subs, lat_total, args.rate, body, prefix)
        ours_lat = await _pubsub_run(url, subs, lat_total, args.rate, body, f"{prefix}-{subs}-l")
        entry["raw"].update({k: v for k, v in raw_lat.items() if k.endswith("_ms")})
        entry["pubsub"].update({k: v for k, v in ours_lat.items() if k.endswith("_ms")})
        entry["throughput_ratio"] = round(entry["pubsub"]["rows_per_s"] / entry["raw"]["rows_per_s"], 3)
        entry["p99_over_raw_ms"] = round(entry["pubsub"]["p99_ms"] - entry["raw"]["p99_ms"], 3)
        entry["meets_targets"] = entry["throughput_ratio"] >= 0.5 and entry["p99_over_raw_ms"] <= 2.0
        report["runs"].append(entry)
    return report


def _table(report: dict[str, Any]) -> str:
    head = (
        f"{'subs':>4} | {'raw rows/s':>10} {'ours rows/s':>11} {'ratio':>6} | {'raw p50':>8} {'raw p99':>8} "
    )
    head += f"{'our p50':>8} {'our p99':>8} (ms) | ok"
    lines = [head, "-" * len(head)]
    for e in report["runs"]:
        raw, ours = e["raw"], e["pubsub"]
        rates = f"{raw['rows_per_s']:>10.0f} {ours['rows_per_s']:>11.0f} {e['throughput_ratio']:>6.2f}"
        times = f"{raw['p50_ms']:>8.2f} {raw['p99_ms']:>8.2f} {ours['p50_ms']:>8.2f} {ours['p99_ms']:>8.2f}"
        lines.append(
            f"{e['subscribers']:>4} | {rates} | {times}      | {'yes' if e['meets_targets'] else 'NO'}"
        )
    lines.append("codec: " + ", ".join(f"{k}={v:,.0f}" for k, v in report["codec"].items()))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout bench pubsub", description=__doc__.split("\n")[0])
    p.add_argument("--redis-url", help="default: start an embedded valkey-server for the run")
    p.add_argument("--subscribers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16])
    p.add_argument("--rows", type=int, default=40_000, help="throughput rows (divided by subscriber count)")
    p.add_argument("--rate", type=float, default=2000.0, help="rows/s of the latency runs")
    p.add_argument("--latency-seconds", type=float, default=3.0)
    p.add_argument("--row-bytes", type=int, default=150)
    args = p.parse_args(argv)
    if args.redis_url:
        report = asyncio.run(_bench(args, args.redis_url))
    else:
        from workers.services import EmbeddedServices

        with EmbeddedServices(with_postgres=False) as services:
            report = asyncio.run(_bench(args, services.redis_url))
    print(json.dumps(report, indent=2))
    print(_table(report))
    return 0 if all(e["meets_targets"] for e in report["runs"]) else 1
