"""`fanout bench peer`: fanout and Synapse 1.163.2 (Redis workers), driven alike, runs alternated.

Both systems run on the same embedded PostgreSQL and Redis (this command starts its own, so
their processes' CPU can be read), each on its own database: fanout as a `LocalCluster` of 2
persisters (write-only, as compose/ deploys them; `targets.py` says why) and 1 sync worker,
Synapse as a main process, 2 event persisters and 1 sync worker (`synapse_config.py`,
`synapse_processes.py`; built into `.cache/synapse-peer/` by `synapse_build.py`). Only one
system runs at a time: each round starts fanout, runs its phases, stops it, then does the same
with Synapse (users and rooms are made on each system's first start and kept in its database).
In each run, the `driver.py` phases: saturation (`--senders` closed-loop senders for `--seconds`:
sends/s; CPU seconds per 1,000 events of the system's server processes and of PostgreSQL +
Redis) and `--rate` events/s for `--latency-seconds` (send start -> seen by a long-poll on the
sync worker, p50/p99). Figures are medians over `--rounds` rounds; the JSON records each fanout
worker's roles as its configuration gave them (`fanout`).

The ceiling is measured first, in the same run: the same driver against the bare aiohttp server
(`bare_server.py`), saturation and latency, so the driver is shown not to be what limits fanout;
the driver's own CPU share is reported beside every phase.

Prints one JSON document on stdout and the figures on stderr; `fanout bench all` takes its
"ahead of Synapse" rows from here (`figures`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from workers.embedded.services import EmbeddedServices
from workers.harness.bench._common import Figure, positive_int, progress, report, scratch_database
from workers.harness.bench.peer.cpu import Accounts
from workers.harness.bench.peer.driver import RoomPair, bare_rooms, latency, saturate, setup_rooms
from workers.harness.bench.peer.synapse_build import VERSION, build_synapse
from workers.harness.bench.peer.synapse_config import SynapseLayout
from workers.harness.bench.peer.synapse_processes import SynapsePeer
from workers.harness.bench.peer.targets import BareTarget, FanoutTarget, SynapseTarget, Target
from workers.harness.bench.profile import recorder, sampled_dir
from workers.harness.cluster import LocalCluster
from workers.harness.upgrade_build import BuildError
from workers.process import event_loop

TARGET_CPU_RATIO = 70.0
TARGET_SENDS_RATIO = 50.0


async def create_synapse_database(admin_url: str) -> str:
    """A new database for Synapse on the server of `admin_url`, with the C collation it requires."""
    name = f"synapse_peer_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(
            f"CREATE DATABASE {name} ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        )
    finally:
        await admin.close()
    return name


async def _phases(
    target: Target, pairs: list[RoomPair], services: Accounts, args: argparse.Namespace, round_: int = 0
) -> dict[str, Any]:
    accounts = Accounts(pids={"servers": target.server_pids(), **services.pids}, trees=services.trees)
    record = recorder(target.cluster) if isinstance(target, FanoutTarget) else None
    progress(f"  {target.name}: saturation, {args.senders} senders, {args.seconds:g} s")
    saturation = await saturate(
        target, pairs, accounts, senders=args.senders, seconds=args.seconds, warmup_s=args.warmup,
        profile=None if record is None else lambda: record(f"round{round_}-saturation"),
    )  # fmt: skip
    progress(
        f"    {saturation['sends_per_s']:,.1f} sends/s, {saturation['cpu_s_per_1000']['servers']} CPU-s"
        f" per 1,000 (servers), driver {saturation['driver_cores']} cores"
    )
    progress(f"  {target.name}: {args.rate:g} events/s for {args.latency_seconds:g} s")
    steady = await latency(
        target, pairs[: args.readers], accounts, rate=args.rate, seconds=args.latency_seconds,
        profile=None if record is None else lambda: record(f"round{round_}-latency"),
    )  # fmt: skip
    progress(
        f"    start -> seen p50 {steady['start_seen']['p50_ms']} ms, p99 {steady['start_seen']['p99_ms']} ms"
    )
    return {"saturation": saturation, "latency": steady}


async def _run(args: argparse.Namespace, services: EmbeddedServices, synapse_python: Path) -> dict[str, Any]:
    assert services.postgres is not None and services.redis is not None
    counted = Accounts(
        pids={"redis": [services.redis.process.pid]}, trees={"postgres": services.postgres.process.pid}
    )
    rooms = max(args.senders, args.readers)
    result: dict[str, Any] = {"benchmark": "peer", "synapse": VERSION, "args": vars(args), "runs": []}

    progress("ceiling: the same driver against the bare aiohttp server")
    bare = BareTarget()
    await bare.start()
    try:
        result["ceiling"] = await _phases(bare, bare_rooms(rooms), counted, args)
    finally:
        await bare.stop()

    admin_url, redis_url = services.database_url, services.redis_url
    workdir = Path(tempfile.mkdtemp(prefix="fanout-bench-peer-"))
    fanout = FanoutTarget(
        LocalCluster(
            await scratch_database(admin_url, "peer"), redis_url, workdir / "fanout",
            persisters=2, sync_workers=1, background_workers=0, channel_prefix=f"peer-{uuid.uuid4().hex[:6]}",
            write_only_persisters=True, cpu_profile=sampled_dir(args.profile),
        )
    )  # fmt: skip
    layout = SynapseLayout(
        workdir / "synapse", await create_synapse_database(admin_url),
        postgres_port=urlsplit(admin_url).port or 5432, redis_port=urlsplit(redis_url).port or 6379,
    )  # fmt: skip
    synapse = SynapseTarget(SynapsePeer(synapse_python, layout))
    pairs: dict[str, list[RoomPair]] = {}
    for round_ in range(1, args.rounds + 1):
        for target in (fanout, synapse):
            progress(f"round {round_}: {target.name}")
            began = time.monotonic()
            await target.start()
            started_s = time.monotonic() - began
            try:
                if isinstance(target, FanoutTarget):
                    result["fanout"] = target.shape()
                if target.name not in pairs:
                    pairs[target.name] = await setup_rooms(target, rooms)
                phases = await _phases(target, pairs[target.name], counted, args, round_)
            finally:
                await target.stop()
            result["runs"].append(
                {"system": target.name, "round": round_, "start_s": round(started_s, 1), **phases}
            )
    result["workdir"] = str(workdir)
    return result


def _median(result: dict[str, Any], system: str, *path: str) -> float:
    values = []
    for run in result["runs"]:
        if run["system"] == system:
            value: Any = run
            for key in path:
                value = value[key]
            values.append(float(value))
    return statistics.median(values) if values else float("nan")


def summary(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Medians over the rounds, by system: sends/s, CPU per 1,000 (servers; PostgreSQL + Redis) at
    saturation, start -> seen p50/p99 at the steady rate, the driver's cores at saturation."""
    paths = {
        "sends_per_s": ("saturation", "sends_per_s"),
        "cpu_servers": ("saturation", "cpu_s_per_1000", "servers"),
        "cpu_services": ("saturation", "cpu_s_per_1000", "postgres_redis"),
        "driver_cores": ("saturation", "driver_cores"),
        "seen_p50": ("latency", "start_seen", "p50_ms"),
        "seen_p99": ("latency", "start_seen", "p99_ms"),
        "steady_cpu_servers": ("latency", "cpu_s_per_1000", "servers"),
    }
    return {s: {k: _median(result, s, *p) for k, p in paths.items()} for s in ("fanout", "synapse")}


def figures(result: dict[str, Any]) -> list[Figure]:
    """fanout and Synapse side by side, the bare server's figure as the ceiling, and the two
    "ahead of Synapse" ratios against their targets, each beside the ratio the bare server gets
    (the most the driver could show)."""
    ceiling = result["ceiling"]
    both = summary(result)
    f, s = both["fanout"], both["synapse"]
    bare_rate = float(ceiling["saturation"]["sends_per_s"])
    bare_p50 = float(ceiling["latency"]["start_seen"]["p50_ms"])
    bare_p99 = float(ceiling["latency"]["start_seen"]["p99_ms"])
    sends_ratio = f["sends_per_s"] / s["sends_per_s"] if s["sends_per_s"] else float("nan")
    cpu_ratio = s["cpu_servers"] / f["cpu_servers"] if f["cpu_servers"] else float("nan")
    # The ratios' ceilings: what the driver would show for a server costing what the bare one does.
    bare_cpu = float(ceiling["saturation"]["cpu_s_per_1000"]["servers"])
    sends_ceiling = bare_rate / s["sends_per_s"] if s["sends_per_s"] else float("nan")
    cpu_ceiling = s["cpu_servers"] / bare_cpu if bare_cpu else float("nan")
    services_ratio = s["cpu_services"] / f["cpu_services"] if f["cpu_services"] else float("nan")
    synapse = f"Synapse {result['synapse']}"
    return [
        Figure("peer", "sends/s, fanout (16 closed-loop senders)", f["sends_per_s"], "req/s", bare_rate),
        Figure("peer", f"sends/s, {synapse}", s["sends_per_s"], "req/s", bare_rate),
        Figure("peer", "driver's cores at fanout's saturation", f["driver_cores"], "cores"),
        Figure("peer", "CPU-s per 1,000 events, fanout servers", f["cpu_servers"], "CPU-s", bare_cpu),
        Figure("peer", f"CPU-s per 1,000 events, {synapse} servers", s["cpu_servers"], "CPU-s", bare_cpu),
        Figure("peer", "CPU-s per 1,000 events, PostgreSQL + Redis, fanout", f["cpu_services"], "CPU-s"),
        Figure("peer", f"CPU-s per 1,000 events, PostgreSQL + Redis, {synapse}", s["cpu_services"], "CPU-s"),
        Figure("peer", "10 events/s start -> seen p50, fanout", f["seen_p50"], "ms", bare_p50),
        Figure("peer", "10 events/s start -> seen p99, fanout", f["seen_p99"], "ms", bare_p99),
        Figure("peer", f"10 events/s start -> seen p50, {synapse}", s["seen_p50"], "ms", bare_p50),
        Figure("peer", f"10 events/s start -> seen p99, {synapse}", s["seen_p99"], "ms", bare_p99),
        Figure(
            "peer", f"ahead of {synapse}: sends/s (fanout / Synapse)", sends_ratio, "x", sends_ceiling,
            target=f">= {TARGET_SENDS_RATIO:g}", met=sends_ratio >= TARGET_SENDS_RATIO,
        ),
        Figure(
            "peer", f"ahead of {synapse}: server CPU per event (Synapse / fanout)", cpu_ratio, "x",
            cpu_ceiling,
            target=f">= {TARGET_CPU_RATIO:g}", met=cpu_ratio >= TARGET_CPU_RATIO,
        ),
        Figure("peer", f"ahead of {synapse}: PostgreSQL + Redis CPU per event", services_ratio, "x"),
    ]  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fanout bench peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=positive_int, default=2, help="fanout, Synapse, fanout, Synapse, ...")
    p.add_argument("--senders", type=positive_int, default=16, help="closed-loop senders at saturation")
    p.add_argument("--seconds", type=float, default=10.0, help="saturation window of each run")
    p.add_argument("--warmup", type=float, default=2.0, help="sends before the saturation window")
    p.add_argument("--rate", type=float, default=10.0, help="events/s of the latency phase")
    p.add_argument("--latency-seconds", type=float, default=10.0, help="length of the latency phase")
    p.add_argument("--readers", type=positive_int, default=4, help="rooms (each with a reader) at that rate")
    p.add_argument(
        "--profile", metavar="DIR",
        help="record the CPU of fanout's workers over each measured window, into DIR/round<N>-<phase>/",
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="1 round, 3 s phases: a smoke run, not figures")
    p.add_argument("--build-only", action="store_true", help="build (or reuse) Synapse's venv, then stop")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.rounds, args.seconds, args.warmup, args.latency_seconds = 1, 3.0, 1.0, 3.0
    try:
        built = build_synapse(say=progress)
    except BuildError as e:
        print(f"fanout bench peer: {e}", file=sys.stderr)
        return 1
    if args.build_only:
        return 0
    started = time.monotonic()
    with EmbeddedServices() as services:
        result = event_loop.run(_run(args, services, built.python))
    result["build"] = {"reused": built.reused, "seconds": round(built.seconds, 1)}
    result["seconds"] = round(time.monotonic() - started, 1)
    report(result, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
