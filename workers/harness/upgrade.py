"""`make upgrade-check` (`fanout upgrade-check`): a rolling upgrade from the previous release to
this tree, under load, checked as a client would see it.

It builds the previous release (`workers.harness.upgrade_build`: the commit release/previous.toml
names, in its own venv), starts it as a local cluster (two persisters, one background worker that
writes typing and presence, two sync workers) on an empty database, which its first worker
migrates, and drives the load generator's users with their long-polling /sync readers. Then it
replaces the workers one at a time with this tree's (`python -m workers.cli worker`), writers
first as docs/operations.md says: SIGTERM, wait for the exit, start the new one, wait until it is
ready, keep the load on for a phase. The first new worker applies this tree's migrations; a
pending migration marked breaking cannot be applied beside running workers (migrate.py's compat
floor), so then the check does what the docs say instead: stop every worker, `fanout migrate`,
start every worker of this tree. Clients keep their tokens throughout: a reader whose token is
refused starts over with an initial sync, and is counted.

It ends with the history check (every reader's events exactly once and in order:
`workers.harness.history`), the clients that started over, the answers with status 5xx by status,
and a table of the phases with their timings. It passes when nothing was lost, duplicated or
reordered, no client started over, no answer was 500 and every worker exited 0.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from workers.embedded.services import given_or_embedded
from workers.harness import chaos
from workers.harness.cluster import LocalCluster
from workers.harness.load_check import LoadReport
from workers.harness.loadgen import LoadDriver, LoadPlan
from workers.harness.upgrade_build import BuildError, PreviousRelease, build_previous_release
from workers.process import event_loop
from workers.storage import connect
from workers.storage.migrate import available_migrations

Say = Callable[[str], None]
#: The order workers are replaced in: the writers first (docs/operations.md, "Upgrading").
ORDER = ["persister1", "persister2", "background1", "sync1", "sync2"]
STREAM_WRITERS = {
    "typing": ["background1"], "presence": ["background1"],
    "account_data": ["persister1", "persister2"], "device_lists": ["persister1", "persister2"],
    "to_device": ["persister1", "persister2"],
}  # fmt: skip


@dataclass(frozen=True)
class CheckPlan:
    """How long each phase holds the load, and the load (its readers always start over on a refused
    token, counted; typing and presence are expected). CI runs it small (tests/cluster)."""

    phase_s: float = 10.0
    announce_interval_s: float = 0.5
    load: LoadPlan = field(
        default_factory=lambda: LoadPlan(users=16, rooms=6, rooms_per_user=2, concurrency=8)
    )


@dataclass
class Phase:
    name: str
    #: How many workers of each release ran during the phase.
    workers: str
    seconds: float = 0.0
    acknowledged: int = 0
    writes_failed: int = 0
    answers_5xx: int = 0
    syncs_retried: int = 0
    note: str = ""


@dataclass
class UpgradeReport:
    previous: str
    phases: list[Phase] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    events_checked: int = 0
    clients: int = 0
    #: What each refused /sync said (the reader started over after each), and how many readers.
    start_overs: list[str] = field(default_factory=list)
    clients_started_over: int = 0
    #: Answers by status, every request of the run (setup, writes, syncs).
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    exits: dict[str, int | None] = field(default_factory=dict)
    #: What stopped the run early (a worker that did not start, a request refused), if anything.
    error: str | None = None

    @property
    def answers_5xx(self) -> dict[int, int]:
        return {s: n for s, n in sorted(self.statuses.items()) if s >= 500}

    @property
    def passed(self) -> bool:
        return (
            self.error is None and not self.problems and not self.start_overs and self.events_checked > 0
            and 500 not in self.statuses and all(code == 0 for code in self.exits.values())
        )  # fmt: skip

    def render(self) -> str:
        lines = [
            f"upgrade-check: {self.previous} -> HEAD",
            "",
            "| phase | workers | time | events acknowledged | writes failed | 5xx answers"
            " | syncs retried | notes |",
            "|---|---|---:|---:|---:|---:|---:|---|",
        ]
        lines += [
            f"| {p.name} | {p.workers} | {p.seconds:.1f} s | {p.acknowledged:,} | {p.writes_failed} |"
            f" {p.answers_5xx} | {p.syncs_retried} | {p.note} |"
            for p in self.phases
        ]
        kinds = chaos.classify(self.problems)
        by_status = ", ".join(f"{s}: {n}" for s, n in self.answers_5xx.items()) or "none"
        lines += [
            "",
            f"history check: {self.events_checked:,} events checked; {kinds['lost']} lost,"
            f" {kinds['duplicated']} duplicated, {kinds['reordered']} reordered, {kinds['other']} other",
            f"clients that started over (initial sync after a refused token): {self.clients_started_over}"
            f" of {self.clients} ({len(self.start_overs)} start-overs)",
            f"answers 5xx: {sum(self.answers_5xx.values())} ({by_status})",
            f"worker exits at the end: {', '.join(f'{n} {c}' for n, c in self.exits.items()) or 'none'}",
        ]
        lines += [f"  - {p}" for p in self.problems[:20]]
        lines += [f"  - started over: {s}" for s in self.start_overs[:20]]
        if self.error:
            lines.append(f"stopped early: {self.error}")
        lines.append(f"upgrade-check: {'PASSED' if self.passed else 'FAILED'}")
        return "\n".join(lines)


class _Meter:
    """The load's counters at a phase's start, to report the phase's share."""

    def __init__(self, driver: LoadDriver, statuses: collections.Counter[int]) -> None:
        self.driver, self.statuses = driver, statuses
        self.started = time.monotonic()
        self.base = self._read()

    def _read(self) -> tuple[int, int, int, int]:
        readers = self.driver.readers + self.driver.probes
        report = self.driver.report
        fives = sum(n for s, n in self.statuses.items() if s >= 500)
        return report.events_sent, report.failed, fives, sum(r.failed_syncs for r in readers)

    def close(self, phase: Phase) -> Phase:
        now = self._read()
        phase.seconds = time.monotonic() - self.started
        phase.acknowledged, phase.writes_failed, phase.answers_5xx, phase.syncs_retried = (
            n - b for n, b in zip(now, self.base, strict=True)
        )
        self.started, self.base = time.monotonic(), now
        return phase


async def _schema(database_url: str) -> tuple[list[int], int]:
    """(applied migration versions, compat floor)."""
    async with connect(database_url) as conn:
        versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_version ORDER BY 1")]
        floor = await conn.fetchval("SELECT floor FROM schema_compat")
    return versions, int(floor or 0)


class UpgradeRun:
    """One check: the cluster, the load on it, and the phases as they happen."""

    def __init__(
        self,
        release: PreviousRelease,
        database_url: str,
        redis_url: str,
        workdir: Path,
        plan: CheckPlan,
        channel_prefix: str,
        say: Say,
    ) -> None:
        self.release, self.database_url, self.plan, self.say = release, database_url, plan, say
        self.cluster = LocalCluster(
            database_url, redis_url, workdir / "workers", channel_prefix=channel_prefix,
            announce_interval_s=plan.announce_interval_s, stream_writers=STREAM_WRITERS,
        )  # fmt: skip
        for spec in self.cluster.workers.values():
            spec.command = [str(release.fanout)]
        self.report = UpgradeReport(previous=f"{release.version} ({release.commit[:12]})")

    def _mix(self) -> str:
        old = sum(1 for s in self.cluster.workers.values() if s.command is not None)
        new = len(self.cluster.workers) - old
        return " + ".join(
            x for x in (f"{old} {self.release.version}" * bool(old), f"{new} HEAD" * bool(new)) if x
        )

    async def run(self) -> UpgradeReport:
        report = self.report
        started = time.monotonic()
        try:
            await self.cluster.start()
            versions, floor = await _schema(self.database_url)
            report.phases.append(Phase(
                f"start {self.release.version}", self._mix(), time.monotonic() - started,
                note=f"migrated an empty database to schema {max(versions, default=0)} (floor {floor})",
            ))  # fmt: skip
            self.say(f"{self.release.version} cluster ready ({', '.join(self.cluster.workers)})")
            await self._under_load()
        except Exception as e:  # the report shows what stopped the run
            report.error = f"{type(e).__name__}: {e}"
        finally:
            report.exits = await self.cluster.stop()
        return report

    async def _under_load(self) -> None:
        plan, report = self.plan, self.report
        trace = aiohttp.TraceConfig()

        async def count(_: aiohttp.ClientSession, __: SimpleNamespace, params: Any) -> None:
            report.statuses[params.response.status] += 1

        trace.on_request_end.append(count)
        load_plan = dataclasses.replace(plan.load, expect_ephemeral=True, start_over=True)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout, trace_configs=[trace]) as session:
            driver = LoadDriver(
                session, self.cluster.urls, self.cluster.event_writers, self.cluster.sync_workers,
                self.database_url, load_plan,
            )  # fmt: skip
            meter = _Meter(driver, report.statuses)
            await driver.setup()
            report.clients = len(driver.readers) + len(driver.probes)
            note = f"{load_plan.users} users, {load_plan.rooms} rooms"
            report.phases.append(meter.close(Phase("users and rooms", self._mix(), note=note)))
            until = asyncio.Event()
            load = asyncio.create_task(driver.run(until=until))
            try:
                await self._phase(meter, load, Phase(f"load on {self.release.version}", self._mix()))
                await self._upgrade(meter, load)
                until.set()
                self.say("draining: every reader catches up, then the history check")
                result: LoadReport = await load
            finally:
                until.set()
                if not load.done():
                    load.cancel()
                readers = driver.readers + driver.probes
                report.start_overs = [f"{r.client.user_id} at {s}" for r in readers for s in r.start_overs]
                report.clients_started_over = sum(1 for r in readers if r.start_overs)
            report.phases.append(meter.close(Phase("drain and check", self._mix(), note="readers caught up")))
        report.problems += result.problems
        report.events_checked = result.events_checked

    async def _phase(self, meter: _Meter, load: asyncio.Task[LoadReport], phase: Phase) -> None:
        """Hold the load for the phase's time (ending early if the load failed)."""
        await asyncio.wait([load], timeout=self.plan.phase_s)
        if load.done():
            load.result()  # raises what stopped it
            raise RuntimeError("the load ended before the upgrade did")
        self.report.phases.append(meter.close(phase))
        self.say(f"{phase.name}: {phase.acknowledged} events in {phase.seconds:.1f}s ({phase.workers})")

    async def _upgrade(self, meter: _Meter, load: asyncio.Task[LoadReport]) -> None:
        applied, _ = await _schema(self.database_url)
        breaking = [m for m in available_migrations() if m.version not in applied and m.breaking]
        if breaking:
            await self._stop_all_and_migrate(meter, load, [m.version for m in breaking])
            return
        for name in ORDER:
            spec = self.cluster.workers[name]
            t0 = time.monotonic()
            code = (await self.cluster.stop(names=[name]))[name]
            stopped = time.monotonic() - t0
            before, _ = await _schema(self.database_url)
            spec.command = None
            await self.cluster.start([name])
            after, floor = await _schema(self.database_url)
            new = [v for v in after if v not in before]
            note = f"exit {code} in {stopped:.1f}s, HEAD ready in {time.monotonic() - t0 - stopped:.1f}s"
            if new:
                note += f"; applied migrations {', '.join(map(str, new))} (floor {floor})"
            if code != 0:
                self.report.problems.append(f"{name} of {self.release.version} exited {code} on SIGTERM")
            await self._phase(meter, load, Phase(f"replace {name}", self._mix(), note=note))

    async def _stop_all_and_migrate(
        self, meter: _Meter, load: asyncio.Task[LoadReport], versions: list[int]
    ) -> None:
        """A breaking migration: every worker stops, `fanout migrate` applies it, every worker of
        this tree starts (docs/operations.md); the clients wait it out with their tokens."""
        t0 = time.monotonic()
        codes = await self.cluster.stop()
        self.report.problems += [f"{n} exited {c} on SIGTERM" for n, c in codes.items() if c != 0]
        migrate = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workers.cli", "migrate", "--database-url", self.database_url
        )
        if await migrate.wait() != 0:
            raise RuntimeError(f"fanout migrate exited {migrate.returncode}")
        for spec in self.cluster.workers.values():
            spec.command = None
        await self.cluster.start()
        note = f"breaking migrations {', '.join(map(str, versions))}: stop all, fanout migrate, start all"
        await self._phase(meter, load, Phase(f"stop all, migrate, start HEAD ({time.monotonic() - t0:.1f}s)",
                                             self._mix(), note=note))  # fmt: skip


async def upgrade_check(
    release: PreviousRelease,
    database_url: str,
    redis_url: str,
    workdir: Path,
    plan: CheckPlan,
    *,
    channel_prefix: str | None = None,
    say: Say = print,
) -> UpgradeReport:
    """Run the check on an empty database; the report says whether it passed (`passed`)."""
    async with connect(database_url) as conn:
        if not await conn.fetchval("SELECT to_regclass('schema_version') IS NULL"):
            return UpgradeReport(
                previous=release.version,
                error=f"{database_url} has a schema: the check needs an empty database, which"
                f" {release.version} migrates from scratch",
            )
    prefix = channel_prefix or f"upgrade-{uuid.uuid4().hex[:8]}"
    return await UpgradeRun(release, database_url, redis_url, workdir, plan, prefix, say).run()


async def _fresh_database(url: str) -> None:
    base, _, name = url.rpartition("/")
    async with connect(f"{base}/postgres") as conn:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')


def say(message: str) -> None:
    print(f"upgrade-check: {message}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout upgrade-check", description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", help="an empty database (default: embedded PostgreSQL, a fresh one)")
    p.add_argument("--redis-url", help="use this Redis (default: embedded Valkey)")
    p.add_argument("--phase-seconds", type=float, default=CheckPlan.phase_s, help="load time per phase")
    p.add_argument("--users", type=int, default=CheckPlan().load.users)
    p.add_argument("--concurrency", type=int, default=CheckPlan().load.concurrency)
    p.add_argument("--cache-dir", type=Path, help="where builds go (default: .cache/upgrade-check)")
    p.add_argument("--workdir", type=Path, help="worker configs, logs, the report (default: temporary)")
    p.add_argument(
        "--build-only", action="store_true", help="build (or reuse) the previous release, then exit"
    )
    args = p.parse_args(argv)
    try:
        release = build_previous_release(cache=args.cache_dir, say=say)
    except BuildError as e:
        print(f"upgrade-check: {e}", file=sys.stderr)
        return 2
    if args.build_only:
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fanout-upgrade-"))
    load = dataclasses.replace(CheckPlan().load, users=args.users, concurrency=args.concurrency)
    plan = CheckPlan(phase_s=args.phase_seconds, load=load)
    with given_or_embedded(args.database_url, args.redis_url) as (database_url, redis_url):
        if not args.database_url:
            database_url = database_url.rsplit("/", 1)[0] + "/fanout_upgrade"
            event_loop.run(_fresh_database(database_url))
        say(f"running {release.version} then HEAD on {database_url}; logs in {workdir / 'workers'}")
        report = event_loop.run(upgrade_check(release, database_url, redis_url, workdir, plan, say=say))
    (workdir / "upgrade-check.json").write_text(json.dumps(
        {"passed": report.passed, "phases": [vars(p) for p in report.phases], "problems": report.problems,
         "start_overs": report.start_overs, "answers_5xx": report.answers_5xx, "error": report.error},
        indent=2,
    ))  # fmt: skip
    print(report.render(), flush=True)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
