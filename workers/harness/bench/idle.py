"""`fanout bench idle`: what the demo's cluster costs per second when nobody uses it.

The demo's topology (`workers.harness.demo.demo_cluster`: 2 persisters, 2 sync workers,
background1 writing typing and presence) on embedded PostgreSQL and Redis, always embedded: their
processes' CPU is part of the figure. A short load of the demo's kind (`--actions`), a wait until
the background worker has caught up and `--settle` seconds more, then `--seconds` of no client
traffic, over which are measured:

* each worker's CPU (user + system, /proc/PID/stat), PostgreSQL's (the postmaster and every child:
  backends, checkpointer, autovacuum...) and Redis's, as % of one core;
* per worker and second: the Redis commands its connections sent (`tot-cmds` of CLIENT LIST, each
  connection matched to its worker by local port), the replication lines it published (RDATA,
  POSITION..., from its /metrics), its named database transactions (the counts of
  `fanout_db_transaction_seconds{name}`, from its /metrics, the five busiest named), and the CPU
  of the PostgreSQL backends serving it;
* the servers' own counts: Redis `INFO commandstats` deltas by command (this benchmark's own
  INFO and CLIENT LIST left out), PostgreSQL's committed and rolled-back transactions
  (`pg_stat_database`, this benchmark's own reads included: 4 in all).

The figure is the five workers' CPU as % of one core (target under 2 %). There is no ceiling:
a process with nothing to do can cost nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from workers.harness.bench._common import Figure, positive_int, progress, report, scratch_database
from workers.harness.bench.peer.cpu import Accounts, process_cpu, spent
from workers.harness.bench.process_sockets import local_ports
from workers.harness.cluster import LocalCluster
from workers.process import event_loop

TARGET_IDLE_PERCENT = 2.0
#: Commands this benchmark sends itself, left out of Redis's counts.
_OWN_COMMANDS = {"info", "client|list", "hello", "client|setinfo", "ping"}


async def _worker_counts(session: aiohttp.ClientSession, url: str) -> Counter[str]:
    """Counters of a worker's /metrics that say what it sent: `db <name>` (named transactions)
    and `out <command> <stream>` (replication lines)."""
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fanout_db_transaction_seconds_count":
                counts[f"db {sample.labels['name']}"] += int(sample.value)
            elif sample.name == "fanout_repl_commands_out_total":
                counts[f"out {sample.labels['command']} {sample.labels['stream']}"] += int(sample.value)
    return counts


async def _redis_by_port(client: aioredis.Redis) -> dict[int, int]:
    """Redis's clients: their port -> commands sent so far."""
    found = {}
    for fields in await client.client_list():
        if "tot-cmds" in fields:
            found[int(fields["addr"].rpartition(":")[2])] = int(fields["tot-cmds"])
    return found


async def _redis_commands(client: aioredis.Redis) -> Counter[str]:
    stats = await client.info("commandstats")
    return Counter({
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in stats.items()
        if name.removeprefix("cmdstat_") not in _OWN_COMMANDS
    })  # fmt: skip


async def _backends(conn: asyncpg.Connection[Any], database: str) -> dict[int, int]:
    """PostgreSQL's backends on `database`: backend pid -> client port."""
    rows = await conn.fetch(
        "SELECT pid, client_port FROM pg_stat_activity WHERE datname = $1 AND client_port > 0", database
    )
    return {row["pid"]: row["client_port"] for row in rows}


async def _transactions(conn: asyncpg.Connection[Any], database: str) -> int:
    value = await conn.fetchval(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", database
    )
    return int(value)


class _Snapshot:
    """Everything counted at one moment."""

    def __init__(self) -> None:
        self.at = 0.0
        self.cpu: dict[str, float] = {}
        self.workers: dict[str, Counter[str]] = {}
        self.redis_ports: dict[int, int] = {}
        self.redis_commands: Counter[str] = Counter()
        self.backend_cpu: dict[int, float] = {}
        self.transactions = 0


async def _snapshot(
    cluster: LocalCluster,
    accounts: Accounts,
    redis: aioredis.Redis,
    pg: asyncpg.Connection[Any],
    database: str,
) -> _Snapshot:
    taken = _Snapshot()
    taken.at = time.monotonic()
    taken.cpu = accounts.sample()
    async with aiohttp.ClientSession() as session:
        for name in cluster.workers:
            taken.workers[name] = await _worker_counts(session, cluster.url(name))
    taken.redis_ports = await _redis_by_port(redis)
    taken.redis_commands = await _redis_commands(redis)
    taken.backend_cpu = {pid: process_cpu(pid) for pid in await _backends(pg, database)}
    taken.transactions = await _transactions(pg, database)
    return taken


def _per_worker(
    cluster: LocalCluster, before: _Snapshot, after: _Snapshot, backends: Mapping[int, int]
) -> dict[str, dict[str, Any]]:
    """Each worker's share of the interval: its CPU, Redis commands, lines out, transactions."""
    seconds = after.at - before.at
    pids = {spec.process.pid: name for name, spec in cluster.workers.items() if spec.process is not None}
    owner_of_port = {port: pids[pid] for port, pid in local_ports(pids).items()}
    redis_cmds: Counter[str] = Counter()
    for port, total in after.redis_ports.items():
        if (name := owner_of_port.get(port)) is not None:
            redis_cmds[name] += total - before.redis_ports.get(port, total)
    backend_cpu: dict[str, float] = {}
    for backend, port in backends.items():
        if (name := owner_of_port.get(port)) is not None and backend in before.backend_cpu:
            used = after.backend_cpu.get(backend, 0.0) - before.backend_cpu[backend]
            backend_cpu[name] = backend_cpu.get(name, 0.0) + used
    result = {}
    for name in cluster.workers:
        sent = after.workers[name] - before.workers[name]
        lines = {key[4:]: round(n / seconds, 2) for key, n in sorted(sent.items()) if key.startswith("out ")}
        db = {key[3:]: round(n / seconds, 2) for key, n in sent.most_common() if key.startswith("db ")}
        result[name] = {
            "cpu_percent": round(100 * (after.cpu[name] - before.cpu[name]) / seconds, 3),
            "redis_commands_per_s": round(redis_cmds[name] / seconds, 2),
            "lines_out_per_s": round(sum(sent[k] for k in sent if k.startswith("out ")) / seconds, 2),
            "lines_out": lines,
            "db_transactions_per_s": round(sum(sent[k] for k in sent if k.startswith("db ")) / seconds, 2),
            "db_transactions": dict(list(db.items())[:5]),
            "postgres_backend_cpu_percent": round(100 * backend_cpu.get(name, 0.0) / seconds, 3),
        }
    return result


async def _load(cluster: LocalCluster, database_url: str, args: argparse.Namespace) -> None:
    from workers.harness.demo import ProgressBar, room_stats_position
    from workers.harness.loadgen import LoadDriver, LoadPlan, with_racing_clients

    plan = with_racing_clients(LoadPlan(
        users=args.users, rooms=args.rooms, actions=args.actions, concurrency=4, expect_ephemeral=True
    ))  # fmt: skip
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        driver = LoadDriver(
            session, cluster.urls, cluster.event_writers, cluster.sync_workers, database_url, plan
        )
        await driver.setup()
        loaded = await driver.run(ProgressBar())
    if loaded.problems:
        progress(f"the load found problems (not this benchmark's concern): {loaded.problems[:3]}")
    deadline = time.monotonic() + 15
    position, top = await room_stats_position(database_url)
    while position < top and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        position, top = await room_stats_position(database_url)


async def _measure(
    args: argparse.Namespace, admin_url: str, redis_url: str, postgres_pid: int, redis_pid: int
) -> dict[str, Any]:
    from workers.harness.demo import demo_cluster

    database_url = await scratch_database(admin_url, "idle")
    database = database_url.rpartition("/")[2]
    workdir = Path(tempfile.mkdtemp(prefix="fanout-bench-idle-"))
    cluster = demo_cluster(database_url, redis_url, workdir / "workers", args.announce_interval)
    await cluster.start()
    redis = aioredis.Redis.from_url(redis_url)
    pg = await asyncpg.connect(admin_url)
    try:
        progress(f"load: {args.actions} actions of the demo's kind")
        await _load(cluster, database_url, args)
        progress(f"settling {args.settle:g} s, then measuring {args.seconds:g} s of no traffic")
        await asyncio.sleep(args.settle)
        pids = {
            name: [spec.process.pid] for name, spec in cluster.workers.items() if spec.process is not None
        }
        accounts = Accounts(pids={**pids, "redis": [redis_pid]}, trees={"postgres": postgres_pid})
        backends = await _backends(pg, database)
        before = await _snapshot(cluster, accounts, redis, pg, database)
        await asyncio.sleep(args.seconds)
        after = await _snapshot(cluster, accounts, redis, pg, database)
        seconds = after.at - before.at
        used = spent(before.cpu, after.cpu)
        workers = _per_worker(cluster, before, after, backends)
        commands = after.redis_commands - before.redis_commands
    finally:
        await redis.aclose()
        await pg.close()
        await cluster.stop()
    share = {name: round(100 * used[name] / seconds, 3) for name in used}
    return {
        "seconds": round(seconds, 2),
        "workers": workers,
        "workers_cpu_percent": round(sum(share[name] for name in workers), 3),
        "postgres_cpu_percent": share["postgres"],
        "redis_cpu_percent": share["redis"],
        "redis_commands_per_s": {k: round(v / seconds, 2) for k, v in commands.most_common()},
        "postgres_transactions_per_s": round((after.transactions - before.transactions) / seconds, 2),
    }


def figures(result: dict[str, Any]) -> list[Figure]:
    """The five workers' CPU at rest as % of one core (target under 2 %), and the servers'."""
    total = result["workers_cpu_percent"]
    return [
        Figure(
            "idle", "CPU at rest, every worker of the demo's cluster", total, "% of a core",
            target=f"< {TARGET_IDLE_PERCENT:g} %", met=total < TARGET_IDLE_PERCENT,
        ),
        Figure("idle", "CPU at rest, PostgreSQL + Redis", result["postgres_cpu_percent"]
               + result["redis_cpu_percent"], "% of a core"),
    ]  # fmt: skip


def _table(result: dict[str, Any]) -> str:
    lines = [
        f"over {result['seconds']} s of no traffic:",
        f"{'process':<13} {'CPU %':>7} {'redis cmd/s':>11} {'lines/s':>8} {'db tx/s':>8}"
        f" {'pg backend %':>12}",
    ]
    for name, w in result["workers"].items():
        lines.append(
            f"{name:<13} {w['cpu_percent']:>7.3f} {w['redis_commands_per_s']:>11.2f}"
            f" {w['lines_out_per_s']:>8.2f} {w['db_transactions_per_s']:>8.2f}"
            f" {w['postgres_backend_cpu_percent']:>12.3f}"
        )
    lines += [
        f"{'all workers':<13} {result['workers_cpu_percent']:>7.3f}   (target < {TARGET_IDLE_PERCENT:g} %)",
        f"{'postgres':<13} {result['postgres_cpu_percent']:>7.3f}   "
        f"{result['postgres_transactions_per_s']} transactions/s",
        f"{'redis':<13} {result['redis_cpu_percent']:>7.3f}   "
        + ", ".join(f"{k} {v}/s" for k, v in result["redis_commands_per_s"].items()),
    ]
    for name, w in result["workers"].items():
        lines.append(f"  {name}: lines/s {w['lines_out']}; db/s {w['db_transactions']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from workers.embedded.services import EmbeddedServices

    p = argparse.ArgumentParser(prog="fanout bench idle", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="how long the quiet cluster is measured")
    p.add_argument("--settle", type=float, default=5.0, help="seconds from the load's end to the measure")
    p.add_argument(
        "--actions", type=positive_int, default=100, help="the load before: actions of the demo's kind"
    )
    p.add_argument("--users", type=positive_int, default=6)
    p.add_argument("--rooms", type=positive_int, default=3)
    p.add_argument(
        "--announce-interval", type=float, default=1.0, help="the workers' position_announce_interval_s"
    )
    args = p.parse_args(argv)
    with EmbeddedServices() as services:
        assert services.postgres is not None and services.redis is not None
        result = event_loop.run(_measure(
            args, services.database_url, services.redis_url,
            services.postgres.process.pid, services.redis.process.pid,
        ))  # fmt: skip
    result["args"] = vars(args)
    progress(_table(result))
    report(result, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
