"""`fanout bench scale`: what one event costs in each process kind as writers, subscribers and streams grow.

Each point runs W writer and N subscriber processes (`scale_roles`: one `ReplicationClient` each,
in-memory generators, so this measures replication over Redis, not PostgreSQL) and S streams. The
writers write R events/s in all, round-robin over the streams; every subscriber reads every stream,
as a sync worker does. Points vary one dimension around a base (W=2, N=4, S=4): writers 1, 2, 4;
subscribers 1, 4, 16; streams 1, 4, 8. Backends: one Redis server; the 3-shard Redis Cluster (3
primaries, 3 replicas) with sharded pub/sub; the same cluster with broadcast PUBLISH. Per event:
* Redis: (S)PUBLISH commands processed, messages delivered to subscribers, bytes in (publishes),
  out (deliveries and replies), to replicas, over the cluster bus; CPU microseconds of all nodes
  together and of the busiest node;
* writer: CPU microseconds of all writers together; subscriber: CPU microseconds of one subscriber.
The fit: Redis CPU per event = a + b x N over the subscriber points (least squares), per backend.

The ceiling, measured in the same run on the one server: bare redis-py processes (1 writer
pipelining PUBLISH, 4 subscribers reading raw replies) moving as many lines of the same size at
the same rate: the least CPU a Python process (and Redis) spends per message. Figures compare the
base point on one server with it. Prints JSON, then a table; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import redis.asyncio as aioredis

from workers.harness.bench._common import Figure, progress
from workers.harness.bench.scale_roles import Job, Result, RolePool
from workers.process import event_loop

#: (writers, subscribers, streams) of the base point; each sweep varies one of them, or the rate.
BASE = (2, 4, 4)
SWEEP = {
    "writers": [(1, 4, 4), (2, 4, 4), (4, 4, 4)],
    "subscribers": [(2, 1, 4), (2, 4, 4), (2, 16, 4)],
    "streams": [(2, 4, 1), (2, 4, 4), (2, 4, 8)],
}
#: The rate sweep at the base point, as multiples of --rate.
RATES = (0.5, 1.0, 2.0)
#: (writers, subscribers, streams, events/s)
Point = tuple[int, int, int, float]
BACKENDS = ("single", "cluster", "broadcast")
STREAM_NAMES = ["events", "caches", "receipts", "typing", "presence", "to_device", "device_lists", "backfill"]


def _points(only_base: bool, rate: float) -> list[Point]:
    if only_base:
        return [(*BASE, rate)]
    shapes = {(*p, rate) for points in SWEEP.values() for p in points}
    return sorted(shapes | {(*BASE, rate * k) for k in RATES})


def _where(backend: str, urls: Sequence[str]) -> dict[str, Any]:
    if backend == "single":
        return {"redis_url": urls[0], "per_stream_channels": True}
    return {
        "redis_url": urls[0],
        "redis_cluster": list(urls),
        "sharded_pubsub": backend == "cluster",
        "per_stream_channels": True,
    }


# -- the servers' counters ---------------------------------------------------------------------------


def _cluster_info(raw: bytes | str) -> dict[str, str]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


async def _counters(url: str, cluster: bool) -> dict[str, float]:
    """One node's cumulative counters: CPU seconds, publishes, bytes in, out, to replicas, on the bus."""
    client = aioredis.Redis.from_url(url)
    try:
        cpu, stats = await client.info("cpu"), await client.info("stats")
        commands = await client.info("commandstats")
        bus = _cluster_info(await client.execute_command("CLUSTER", "INFO")) if cluster else {}  # type: ignore[no-untyped-call]
        role = (await client.info("replication")).get("role", "master")
    finally:
        await client.aclose()
    return {
        "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        "publishes": sum(commands.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("publish", "spublish")),
        "bytes_in": stats["total_net_input_bytes"],
        "bytes_out": stats["total_net_output_bytes"],
        "bytes_to_replicas": stats.get("total_net_repl_output_bytes", 0),
        "bus_bytes": float(bus.get("cluster_stats_pubsub_bytes_sent", 0)),
        "primary": 1.0 if role == "master" else 0.0,
    }


async def _all_counters(urls: Sequence[str], cluster: bool) -> dict[str, dict[str, float]]:
    return {url: await _counters(url, cluster) for url in urls}


def _delta(
    after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    return {url: {k: after[url][k] - before[url].get(k, 0.0) for k in after[url]} for url in after}


# -- one point ---------------------------------------------------------------------------------------


async def _point(
    pool: RolePool, args: argparse.Namespace, backend: str, urls: Sequence[str], point: Point
) -> dict[str, Any]:
    writers_n, subscribers_n, streams_n, rate = point
    prefix = f"scale-{backend}-{writers_n}-{subscribers_n}-{streams_n}-{time.monotonic_ns() % 10**8}"
    writers = [f"w{i}" for i in range(1, writers_n + 1)]
    streams = STREAM_NAMES[:streams_n]
    per_writer = max(1, round(rate * args.seconds / writers_n))
    events = per_writer * writers_n
    common: Job = {"where": _where(backend, urls), "prefix": prefix, "streams": streams, "writers": writers}
    jobs: list[Job] = [
        {**common, "role": "subscriber", "name": f"s{i}", "expected": events} for i in range(subscribers_n)
    ]
    jobs += [
        {**common, "role": "writer", "name": w, "rate": rate / writers_n, "events": per_writer,
         "body_bytes": args.row_bytes}
        for w in writers
    ]  # fmt: skip
    before: dict[str, dict[str, float]] = {}
    cluster = backend != "single"

    async def snapshot() -> None:
        before.update(await _all_counters(urls, cluster))

    results = await pool.run(jobs, snapshot)
    nodes = _delta(await _all_counters(urls, cluster), before)
    subs, writes = results[:subscribers_n], results[subscribers_n:]
    return _per_event(backend, point, events, nodes, subs, writes)


def _per_event(
    backend: str, point: Point, events: int, nodes: dict[str, dict[str, float]],
    subs: list[Result], writes: list[Result],
) -> dict[str, Any]:  # fmt: skip
    def total(key: str) -> float:
        return sum(n[key] for n in nodes.values())

    complete = all(s["received"] >= events for s in subs)
    return {
        "backend": backend,
        "writers": point[0],
        "subscribers": point[1],
        "streams": point[2],
        "rate": point[3],
        "events": events,
        "complete": complete,
        "missing": sum(max(0, events - s["received"]) for s in subs),
        "publish_errors": sum(w["publish_errors"] for w in writes),
        "per_event": {
            "redis_publishes": round(total("publishes") / events, 3),
            "redis_deliveries": round(sum(s["lines"] for s in subs) / events, 3),
            "redis_bytes_in": round(total("bytes_in") / events, 1),
            "redis_bytes_out": round(total("bytes_out") / events, 1),
            "redis_bytes_to_replicas": round(total("bytes_to_replicas") / events, 1),
            "cluster_bus_bytes": round(total("bus_bytes") / events, 1),
            "redis_cpu_us": round(total("cpu_s") / events * 1e6, 2),
            "busiest_node_cpu_us": round(max(n["cpu_s"] for n in nodes.values()) / events * 1e6, 2),
            "writers_cpu_us": round(sum(w["cpu_s"] for w in writes) / events * 1e6, 2),
            "subscriber_cpu_us": round(sum(s["cpu_s"] for s in subs) / len(subs) / events * 1e6, 2),
        },
    }


async def _ceiling(pool: RolePool, args: argparse.Namespace, url: str) -> dict[str, Any]:
    """Bare redis-py at the base point's shape on one server: 1 writer, 4 subscribers, 1 channel."""
    events = max(1, round(args.rate * args.seconds))
    channel = f"scale-raw-{time.monotonic_ns() % 10**8}"
    jobs: list[Job] = [
        {"role": "raw_subscriber", "url": url, "channel": channel, "expected": events} for _ in range(4)
    ]
    jobs.append({"role": "raw_writer", "url": url, "channel": channel, "rate": args.rate, "events": events,
                 "body_bytes": args.row_bytes})  # fmt: skip
    before: dict[str, dict[str, float]] = {}

    async def snapshot() -> None:
        before.update(await _all_counters([url], False))

    results = await pool.run(jobs, snapshot)
    node = _delta(await _all_counters([url], False), before)[url]
    subs, writer = results[:4], results[4]
    return {
        "events": events,
        "complete": all(s["received"] >= events for s in subs),
        "per_message": {
            "redis_cpu_us": round(node["cpu_s"] / events * 1e6, 2),
            "writer_cpu_us": round(writer["cpu_s"] / events * 1e6, 2),
            "subscriber_cpu_us": round(sum(s["cpu_s"] for s in subs) / 4 / events * 1e6, 2),
        },
    }


def _least_squares(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(a, b) of y = a + b x; NaN when fewer than two distinct x."""
    if len(set(xs)) < 2:
        return float("nan"), float("nan")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def fit_subscribers(points: list[dict[str, Any]], key: str) -> dict[str, float]:
    """per_event[key] = a + b x N over `points` (the subscriber sweep)."""
    xs = [float(p["subscribers"]) for p in points]
    a, b = _least_squares(xs, [float(p["per_event"][key]) for p in points])
    return {"a": round(a, 2), "b": round(b, 2)}


def fit_rate(points: list[dict[str, Any]], key: str) -> dict[str, float]:
    """per_event[key] = marginal + fixed / R over `points` (the rate sweep): `fixed` is what the
    process kind spends per second whatever the rate (timers, announcements), in microseconds."""
    xs = [1 / float(p["rate"]) for p in points]
    marginal, fixed = _least_squares(xs, [float(p["per_event"][key]) for p in points])
    return {"marginal_us": round(marginal, 2), "fixed_us_per_s": round(fixed, 1)}


def _fits(runs: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    """The subscriber fit (W=2, S=4 at --rate) and the rate fit (the base shape) of one backend."""
    by_subscribers = [r for r in runs if (r["writers"], r["streams"], r["rate"]) == (BASE[0], BASE[2], rate)]
    by_rate = [r for r in runs if (r["writers"], r["subscribers"], r["streams"]) == BASE]
    return {
        "subscribers": {
            k: fit_subscribers(by_subscribers, k) for k in ("redis_cpu_us", "busiest_node_cpu_us")
        },
        "rate": {k: fit_rate(by_rate, k) for k in ("redis_cpu_us", "writers_cpu_us", "subscriber_cpu_us")},
    }


# -- the run -----------------------------------------------------------------------------------------


async def _bench(args: argparse.Namespace, single_url: str, cluster_urls: Sequence[str]) -> dict[str, Any]:
    points = _points(args.base_only, args.rate)
    largest = max(w + n for w, n, _, _ in points)
    report: dict[str, Any] = {
        "rate_events_per_s": args.rate, "seconds": args.seconds, "row_bytes": args.row_bytes,
        "layout": "one process per writer and per subscriber; in-memory generators (no PostgreSQL)",
        "runs": [], "fits": {},
    }  # fmt: skip
    pool = RolePool(max(largest, 5))
    try:
        progress("ceiling: bare redis-py, 1 writer and 4 subscribers on one server ...")
        report["ceiling"] = await _ceiling(pool, args, single_url)
        for backend in args.backends:
            urls = [single_url] if backend == "single" else list(cluster_urls)
            for point in points:
                progress(
                    f"{backend}: {point[0]} writer(s), {point[1]} subscriber(s), {point[2]} stream(s),"
                    f" {point[3]:.0f} events/s ..."
                )
                report["runs"].append(await _point(pool, args, backend, urls, point))
            report["fits"][backend] = _fits([r for r in report["runs"] if r["backend"] == backend], args.rate)
    finally:
        pool.close()
    return report


def _table(report: dict[str, Any]) -> str:
    head = (f"{'backend':<9} {'W':>2} {'N':>3} {'S':>2} {'R':>5} | {'pub':>5} {'deliv':>6} {'B in':>6}"
            f" {'B out':>7} {'B repl':>7} {'B bus':>7} | {'redis':>7} {'busiest':>7} {'writers':>7}"
            f" {'1 sub':>6} (us/event)")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in report["runs"]:
        e = r["per_event"]
        flag = "" if r["complete"] else f"  INCOMPLETE ({r['missing']} rows missing)"
        lines.append(
            f"{r['backend']:<9} {r['writers']:>2} {r['subscribers']:>3} {r['streams']:>2} {r['rate']:>5.0f} |"
            f" {e['redis_publishes']:>5.2f} {e['redis_deliveries']:>6.2f} {e['redis_bytes_in']:>6.0f}"
            f" {e['redis_bytes_out']:>7.0f} {e['redis_bytes_to_replicas']:>7.0f}"
            f" {e['cluster_bus_bytes']:>7.0f} |"
            f" {e['redis_cpu_us']:>7.1f} {e['busiest_node_cpu_us']:>7.1f} {e['writers_cpu_us']:>7.1f}"
            f" {e['subscriber_cpu_us']:>6.1f}{flag}"
        )
    c = report["ceiling"]["per_message"]
    lines.append(f"ceiling (bare redis-py, one server, per message): redis {c['redis_cpu_us']} us, writer"
                 f" {c['writer_cpu_us']} us, one subscriber {c['subscriber_cpu_us']} us")  # fmt: skip
    for backend, fits in report["fits"].items():
        text = ", ".join(f"{k} = {v['a']} + {v['b']} x N" for k, v in fits["subscribers"].items())
        lines.append(f"fit {backend}, W=2 S=4: {text}")
        text = ", ".join(
            f"{k} = {v['marginal_us']} + {v['fixed_us_per_s']} / R" for k, v in fits["rate"].items()
        )
        lines.append(f"fit {backend}, W=2 N=4 S=4: {text}")
    return "\n".join(lines)


def figures(report: dict[str, Any]) -> list[Figure]:
    """CPU per event at the base point on one server, beside bare redis-py's per message."""
    ceiling = report["ceiling"]["per_message"]
    rate = report["rate_events_per_s"]
    base = [r for r in report["runs"] if r["backend"] == "single" and r["rate"] == rate
            and (r["writers"], r["subscribers"], r["streams"]) == BASE]  # fmt: skip
    found: list[Figure] = []
    for run in base:
        shape = f"W={BASE[0]} N={BASE[1]} S={BASE[2]}, one server"
        for key, name in (("subscriber_cpu_us", "one subscriber"), ("writers_cpu_us", "writers"),
                          ("redis_cpu_us", "Redis")):  # fmt: skip
            ceiling_key = "writer_cpu_us" if key == "writers_cpu_us" else key
            found.append(Figure("scale", f"{name} CPU per event, {shape}", run["per_event"][key], "us",
                                ceiling[ceiling_key]))  # fmt: skip
    return found


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout bench scale", description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=1000.0, help="events/s written, all writers together")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each point's run")
    p.add_argument("--row-bytes", type=int, default=150)
    p.add_argument("--backends", type=lambda s: s.split(","), default=list(BACKENDS),
                   help=f"comma-separated, from {','.join(BACKENDS)}")  # fmt: skip
    p.add_argument("--base-only", action="store_true", help="only the base point (W=2, N=4, S=4)")
    args = p.parse_args(argv)
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        p.error(f"unknown backend(s) {sorted(unknown)}: choose from {', '.join(BACKENDS)}")
    from workers.embedded.redis_cluster import start_redis_cluster
    from workers.embedded.services import EmbeddedServices

    with ExitStack() as stack:
        single = stack.enter_context(EmbeddedServices(with_postgres=False))
        cluster_urls: list[str] = []
        if set(args.backends) - {"single"}:
            progress("starting a Redis Cluster: 3 primaries, 3 replicas ...")
            cluster = start_redis_cluster()
            stack.callback(cluster.stop)
            cluster_urls = cluster.urls
        report = event_loop.run(_bench(args, single.redis_url, cluster_urls))
    print(json.dumps(report, indent=2))
    print(_table(report))
    return 0 if all(r["complete"] for r in report["runs"]) and report["ceiling"]["complete"] else 1
