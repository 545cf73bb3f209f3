"""`fanout demo`: the main job. A real local cluster under a realistic load, verified end to end.

With no URLs it starts the embedded PostgreSQL and Redis; then it launches 2 persisters, 2 sync
workers and 1 background worker as subprocesses, drives users joining and leaving rooms, sending
messages, changing state, typing and setting presence, writing account data, sending to-device
messages and uploading device keys (progress on stderr), and checks that every sync client saw
every event of its rooms, every account-data change, its own device-list changes and every
to-device message sent to its device exactly once and in order, and that typing and presence
reached the readers; every room's stored events are judged by the Matrix authorization rules twice,
as written from the spec and by Synapse's own `event_auth`. It prints a summary (events/s,
persist-to-visible latency on every sync worker, invalidation messages vs per-key invalidation),
runs the invalidation audit on the demo's data, and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from workers.embedded.services import given_or_embedded
from workers.harness.auth_replay import judge_with_built_synapse
from workers.harness.bench._common import positive_int
from workers.harness.bench.profile import recorder, sampled_dir
from workers.harness.cluster import LocalCluster
from workers.harness.load_check import LoadReport, keep_for_diagnosis
from workers.harness.loadgen import LoadDriver, LoadPlan, with_racing_clients
from workers.harness.upgrade_build import BuildError
from workers.process import event_loop
from workers.storage import connect
from workers.storage.migrate import migrate_url


class ProgressBar:
    """A one-line bar on a terminal (redrawn at most 10 times a second), a line per 10% otherwise."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._last = 0.0
        self._last_tenth = -1

    def __call__(self, done: int, total: int, note: str) -> None:
        now = time.monotonic()
        tenth = 10 * done // max(total, 1)
        if self._tty and (now - self._last >= 0.1 or done >= total):
            width = 30
            filled = width * done // max(total, 1)
            end = "\n" if done >= total else ""
            sys.stderr.write(
                f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} actions  {note}   {end}"
            )
            sys.stderr.flush()
            self._last = now
        elif not self._tty and tenth != self._last_tenth:
            print(f"  {done}/{total} actions  {note}", file=sys.stderr, flush=True)
            self._last_tenth = tenth


def say(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


async def _create_database(url: str) -> None:
    base, _, name = url.rpartition("/")
    async with connect(f"{base}/postgres") as conn:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await conn.execute(f'CREATE DATABASE "{name}"')


async def room_stats_position(database_url: str) -> tuple[int, int]:
    async with connect(database_url) as conn:
        position = await conn.fetchval(
            "SELECT position FROM background_progress WHERE task_name = 'room_stats'"
        )
        top = await conn.fetchval("SELECT coalesce(max(stream_ordering), 0) FROM events")
    return int(position or 0), int(top)


def demo_cluster(
    database_url: str,
    redis_url: str,
    workdir: Path,
    announce_interval_s: float,
    cpu_profile: Path | None = None,
) -> LocalCluster:
    """The demo's cluster, not started: 2 persisters (writing events, account data, device lists
    and to-device), 2 sync workers, background1 (room stats, and the typing and presence writer).
    `fanout bench idle` measures this same topology at rest. `cpu_profile`: the workers run under
    the CPU sampler (`fanout bench demo --profile`)."""
    return LocalCluster(
        database_url, redis_url, workdir, channel_prefix=f"demo-{uuid.uuid4().hex[:8]}",
        announce_interval_s=announce_interval_s, registration="open", cpu_profile=cpu_profile,
        stream_writers={
            "typing": ["background1"], "presence": ["background1"],
            "account_data": ["persister1", "persister2"], "device_lists": ["persister1", "persister2"],
            "to_device": ["persister1", "persister2"],
        },
    )  # fmt: skip


async def run_demo(
    args: argparse.Namespace, database_url: str, redis_url: str, workdir: Path
) -> dict[str, Any]:
    if not args.database_url:
        await _create_database(database_url)
    say(f"database {database_url}")
    say(f"redis    {redis_url}")
    await migrate_url(database_url)
    cluster = demo_cluster(
        database_url, redis_url, workdir / "workers", args.announce_interval, sampled_dir(args.profile)
    )
    say(f"starting {len(cluster.workers)} workers ({', '.join(cluster.workers)}); logs in {cluster.workdir}")
    started = time.monotonic()
    await cluster.start()
    say(f"cluster ready in {time.monotonic() - started:.1f}s")
    plan = with_racing_clients(LoadPlan(
        users=args.users, rooms=args.rooms, actions=args.actions, concurrency=args.concurrency,
        expect_ephemeral=True,
    ))  # fmt: skip
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            driver = LoadDriver(
                session, cluster.urls, cluster.event_writers, cluster.sync_workers, database_url, plan
            )
            say(f"setting up {plan.users} users and {plan.rooms} rooms")
            await driver.setup()
            say("driving the load")
            record = recorder(cluster)
            recording = None if record is None else record("load")
            report: LoadReport = await driver.run(ProgressBar())
            for written in () if recording is None else recording.wait():
                say(f"profile: {written}")
            if report.problems:
                kept = await keep_for_diagnosis(driver, workdir)
                say(f"what the check judged: {', '.join(str(path) for path in kept)}")
        deadline = time.monotonic() + 10
        position, top = await room_stats_position(database_url)
        while position < top and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            position, top = await room_stats_position(database_url)
        if position < top:
            report.problems.append(f"background worker stuck at {position}, events reach {top}")
        if args.keep:
            await _serve_until_stopped(cluster, redis_url, database_url)
    finally:
        codes = await cluster.stop()
    bad_exits = {name: code for name, code in codes.items() if code != 0}
    if bad_exits:
        report.problems.append(f"workers did not stop cleanly: {bad_exits}")
    synapse = await _judged_by_synapse(database_url, report) if args.synapse_judge else None
    summary = report.summary()
    summary["synapse_auth"] = synapse
    summary["workers"] = list(cluster.workers)
    summary["background_position"] = position
    return summary


async def _judged_by_synapse(database_url: str, report: LoadReport) -> dict[str, int] | None:
    """Every room's stored events judged by Synapse's own `event_auth` too (a second judge, the
    peer's code), in Synapse's virtualenv (built the first time, about a minute); its refusals and
    a failed build are the run's problems."""
    try:
        verdict = await judge_with_built_synapse(database_url, say=say)
    except (BuildError, RuntimeError) as e:
        report.problems.append(f"Synapse's auth judge could not run: {e} (--no-synapse-judge leaves it out)")
        return None
    report.problems += verdict.problems()
    return {"events": verdict.events, "rooms": verdict.rooms, "refused": len(verdict.refused)}


async def _serve_until_stopped(cluster: LocalCluster, redis_url: str, database_url: str) -> None:
    """Keep the cluster up for the user (the README's quickstart) until Ctrl-C or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    listing = cluster.workdir / "cluster.json"
    listing.write_text(json.dumps({"workers": cluster.urls, "server_name": "localhost"}, indent=2))
    say("the cluster stays up (Ctrl-C stops it); every worker serves the Matrix client API:")
    for name in cluster.workers:
        say(f"  {name:<12} {cluster.url(name)}")
    say(f"  database     {database_url}")
    say(f"  redis        {redis_url}")
    say(f"  the same as JSON, for scripts: {listing}")
    await stop.wait()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(signum)


def _print_summary(summary: dict[str, Any]) -> None:
    saved = summary["per_key_invalidation_messages"] - summary["invalidation_messages"]
    lines = [
        "",
        "fanout demo summary",
        f"  workers                      {', '.join(summary['workers'])}",
        f"  actions / events persisted   {summary['actions']} / {summary['events_sent']}"
        f" ({summary['rejected_by_rules']} refused by room rules)",
        f"  throughput                   {summary['events_per_s']} events/s,"
        f" {summary['actions_per_s']} actions/s over {summary['seconds']} s"
        f" (the clients used {summary['client_cores']:.2f} of a core)",
        f"  persist-to-visible on every sync worker  p50 {summary['latency_p50_ms']} ms,"
        f" p99 {summary['latency_p99_ms']} ms ({summary['latency_samples']} messages)",
        f"  syncs checked                {summary['syncs']}",
        f"  redactions                   {summary['redactions_sent']}"
        " (each read back pruned on every sync worker)",
        f"  receipts / one-time keys     {summary['receipts_sent']} receipts set, "
        f"{summary['receipts_seen']} seen in /sync; {summary['one_time_keys_uploaded']} keys uploaded, "
        f"{summary['one_time_keys_claimed']} claimed (each once)",
        f"  membership churn             {summary['membership_changes']} changes; "
        f"{summary['invites_and_knocks_seen']} invites and knocks seen, "
        f"{summary['left_and_pending_seen']} of them with the room under leave too",
        f"  typing / presence            {summary['typing_updates_sent']} / "
        f"{summary['presence_updates_sent']} sent; {summary['typing_notifications_seen']} / "
        f"{summary['presence_events_seen']} seen in /sync",
        f"  account data / to-device     {summary['account_data_writes']} / {summary['to_device_sent']} sent;"
        f" {summary['account_data_seen']} / {summary['to_device_seen']} seen in /sync (each checked once)",
        f"  device-list changes          {summary['device_changes']} key uploads;"
        f" {summary['device_list_notices_seen']} device_lists.changed entries seen",
        f"  invalidation messages        {summary['invalidation_messages']} sent; per-key invalidation would"
        f" have sent {summary['per_key_invalidation_messages']} ({saved} saved)",
        f"  racing membership pairs      {summary['racing_pairs_sent']} sent through two workers at once:"
        f" {summary['racing_pairs_both_accepted']} both accepted, {summary['racing_pairs_one_refused']}"
        f" one refused, {summary['racing_pairs_both_refused']} both refused,"
        f" {summary['racing_pairs_unknown']} unknown (a fault)",
        f"  readers / laggards           {summary['worker_switches']} sync worker switches;"
        f" {summary['laggard_syncs']} laggard syncs after a lag ({summary['laggard_full_pages']} paged);"
        f" {summary['limited_answers']} limited answers, {summary['gaps_filled']} gaps filled"
        f" ({summary['gap_events_fetched']} events via /messages)",
        f"  sends through a persister    {summary['sent_via_persister']}, of them"
        f" {summary['sent_via_wrong_persister']} not the room's; {summary['sent_via_other_workers']}"
        " through other workers",
        f"  auth rules (stored events)   {summary['auth_events_replayed']} replayed in stream order,"
        f" {summary['auth_violations']} refused by the Matrix authorization rules",
        _synapse_line(summary.get("synapse_auth")),
        f"  verification                 {'PASSED' if summary['verified'] else 'FAILED'}",
    ]
    lines += [f"    - {p}" for p in summary["problems"]]
    print("\n".join(lines), flush=True)


def _synapse_line(verdict: dict[str, int] | None) -> str:
    if verdict is None:
        return "  Synapse's event_auth         not run"
    return (f"  Synapse's event_auth         {verdict['events']} stored events of {verdict['rooms']} rooms"
            f" judged, {verdict['refused']} refused")  # fmt: skip


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    """The servers and the load's size: `fanout demo` and `fanout bench demo` take the same."""
    p.add_argument("--database-url", help="use this database (default: embedded PostgreSQL)")
    p.add_argument("--redis-url", help="use this Redis (default: embedded Valkey)")
    p.add_argument("--users", type=positive_int, default=24)
    p.add_argument("--rooms", type=positive_int, default=8)
    p.add_argument("--actions", type=positive_int, default=3000)
    p.add_argument("--concurrency", type=positive_int, default=16)
    p.add_argument("--announce-interval", type=float, default=1.0, help="seconds between POSITIONs")
    p.add_argument(
        "--no-synapse-judge", dest="synapse_judge", action="store_false",
        help="leave out the second judge of the stored rooms, Synapse's own event_auth (its virtualenv"
        " is built under .cache/ the first time, from PyPI)",
    )  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout demo", description=__doc__.split("\n\n")[0])
    add_load_arguments(p)
    p.add_argument("--workdir", type=Path, help="where configs, logs and the report go (default: temporary)")
    p.add_argument("--no-audit", action="store_true", help="skip the Spark invalidation audit at the end")
    p.add_argument("--keep", action="store_true", help="after the checks, keep the cluster up until Ctrl-C")
    args = p.parse_args(argv)
    args.profile = None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fanout-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    with given_or_embedded(args.database_url, args.redis_url) as (server_url, redis_url):
        database_url = demo_database_url(args, server_url)
        summary = demo_summary(args, database_url, redis_url, workdir)
        _print_summary(summary)
        print(f"  summary JSON                 {workdir / 'summary.json'}")
        if not args.no_audit:
            summary["audit_exit"] = _run_audit(database_url, workdir / "audit", len(summary["workers"]))
    return 0 if summary["verified"] and summary.get("audit_exit", 0) == 0 else 1


def demo_database_url(args: argparse.Namespace, server_url: str) -> str:
    """The demo's database: the one `--database-url` names, else the embedded server's own
    `fanout_demo` (created by the run). Everything that reads the demo's data (the load's checks,
    the audit) takes this URL, never the embedded server's admin URL."""
    return args.database_url or server_url.rsplit("/", 1)[0] + "/fanout_demo"


def demo_summary(
    args: argparse.Namespace, database_url: str, redis_url: str, workdir: Path
) -> dict[str, Any]:
    """Run the demo's cluster and load on `database_url` (`demo_database_url`) and return its
    summary, also written to `workdir/summary.json`. `fanout bench demo` runs the same load
    through this."""
    summary = event_loop.run(run_demo(args, database_url, redis_url, workdir))
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _run_audit(database_url: str, out: Path, subscribers: int) -> int:
    """The Spark invalidation audit over the demo's own data. Every worker subscribes to
    the one channel, so each invalidation fans out to all of them; the applied record holds the
    workers that serve reads only (persisters write only)."""
    try:
        from analytics.cli import main as audit_main
    except ImportError as e:
        say(f"audit skipped: {e} (install the 'audit' extra)")
        return 0
    say(f"running the invalidation audit (Spark) into {out}")
    code = audit_main(
        ["run", "--database-url", database_url, "--out", str(out), "--subscribers", str(subscribers)]
    )
    say(f"audit report: {out} (exit {code})")
    return code
