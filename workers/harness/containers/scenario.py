"""The whole container run of `make containers`, step by step, each step with its figure.

Engine, base, images (size and build time), what the images promise, the stack up (time to
healthy), the demo's load through the published ports with the demo's history check, a persister
and a sync replica crashed mid-load (the restart policy brings them back) and Redis restarted
(`docker restart`) under a second load, the Spark audit service into its volume, the whole stack
stopped (each worker's exit code and time), and the stack up again on the same volumes (the first
run's access and sync tokens still work). The project is removed at the end whatever happened;
a dockerd started here is stopped.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from workers.harness.chaos import classify
from workers.harness.cluster_client import ClusterClient
from workers.harness.containers import promises
from workers.harness.containers.base import make_base
from workers.harness.containers.commands import StepFailed, docker, run, say
from workers.harness.containers.engine import DOCKERD_ARGS, engine
from workers.harness.containers.images import IMAGES, Built, build
from workers.harness.containers.stack import WORKERS, Stack, announce
from workers.harness.load_check import LoadReport, keep_for_diagnosis
from workers.harness.loadgen import LoadDriver, LoadPlan

EVENT_WRITERS = ["persister1", "persister2"]
#: What the run crashes mid-load (SIGKILL of the container's process) and restarts.
CRASHED = ("persister2", "sync-1")


@dataclass(frozen=True)
class Options:
    repo: Path
    workdir: Path
    users: int = 24
    rooms: int = 8
    actions: int = 1500
    concurrency: int = 16


@dataclass
class Outcome:
    """What the run found: the figures of each step and every problem (none: it passed)."""

    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def check(self, step: str, problems: list[str]) -> None:
        for problem in problems:
            say(f"  PROBLEM ({step}): {problem}")
        self.problems += [f"{step}: {p}" for p in problems]


def mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB"


def run_all(options: Options) -> Outcome:
    """Run every step; the outcome's problems say what failed. A step that cannot go on raises
    `StepFailed`, after the stack is removed."""
    outcome = Outcome()
    logs = options.workdir
    with engine(logs / "dockerd.log") as docker_engine:
        how = "already running"
        if docker_engine.started:
            how = f"started here: dockerd {' '.join(DOCKERD_ARGS)}"
        say(f"engine: Docker {docker_engine.version} ({how})")
        build_images(options, outcome)
        image_promises(options, outcome)
        stack = Stack(options.repo, options.workdir, f"fanoutct{uuid.uuid4().hex[:8]}")
        announce(stack)
        try:
            on_stack(stack, options, outcome)
        finally:
            say("removing the project (containers, network, volumes)")
            stack.down()
    return outcome


def build_images(options: Options, outcome: Outcome) -> None:
    say("base: Debian bookworm by debootstrap from this machine's apt sources, docker import")
    base = make_base(options.workdir / "base.log")
    made = "reused (same inputs)" if base.cached else f"made in {base.seconds:.1f}s from {base.mirror}"
    say(f"base {base.tag}: {mb(base.size_bytes)}, {made}")
    outcome.figures["base"] = {
        "tag": base.tag, "size_mb": round(base.size_bytes / 1e6), "cached": base.cached,
        "seconds": round(base.seconds, 1),
    }  # fmt: skip
    for spec in IMAGES:
        say(f"building {spec.tag} ({spec.dockerfile}, BASE=fanout-base:bookworm)")
        log = options.workdir / f"build-{spec.role}.log"
        built: Built = build(spec, "fanout-base:bookworm", options.repo, log)
        state = "unchanged (every step cached)" if built.cached else "built"
        say(f"image {spec.tag}: {mb(built.size_bytes)}, {state} in {built.seconds:.1f}s")
        outcome.figures[f"image_{spec.role}"] = {
            "size_mb": round(built.size_bytes / 1e6), "seconds": round(built.seconds, 1),
            "cached": built.cached,
        }  # fmt: skip


def image_promises(options: Options, outcome: Outcome) -> None:
    for spec in IMAGES:
        if spec.role in ("worker", "audit"):
            finding = promises.image_holds_nothing_extra(spec.tag, options.repo)
            say(f"image {spec.tag}: {finding.figure}")
            outcome.check(f"image {spec.role}", finding.problems)


def on_stack(stack: Stack, options: Options, outcome: Outcome) -> None:
    say("up: 2 persisters, 2 sync workers, a background worker, PostgreSQL 15 and Redis (with its ACL)")
    stack.up()
    healthy = stack.wait_healthy()
    say(f"every container healthy in {healthy:.1f}s")
    outcome.figures["first_healthy_s"] = round(healthy, 1)
    urls = stack.urls()
    say("published: " + ", ".join(f"{name} {url}" for name, url in urls.items()))

    say(f"load: the demo's ({options.users} users, {options.rooms} rooms, {options.actions} actions)"
        " through the published ports, then the demo's history check")  # fmt: skip
    report, kept = asyncio.run(steady_load(stack, urls, options))
    outcome.figures["load"] = figures_of(report)
    show_load(report, outcome, "load")

    for container in stack.containers():
        if container.service in WORKERS:
            checks = [
                ("process", promises.runs_unprivileged(stack, container)),
                ("logs", promises.logs_are_json(container)),
                ("config", promises.configured_from_file_and_environment(stack, container)),
            ]
            say(f"container {container.name}: " + "; ".join(f"{k} {f.figure}" for k, f in checks))
            for key, finding in checks:
                outcome.check(f"{container.name} {key}", finding.problems)

    say(f"faults under a second load: SIGKILL of {' and '.join(CRASHED)} (the restart policy brings them"
        " back), then docker restart redis")  # fmt: skip
    faults, report = asyncio.run(faulted_load(stack, options))
    outcome.figures["faults"] = {**faults, **figures_of(report)}
    show_load(report, outcome, "faults")

    audit(stack, outcome)
    stop_all(stack, outcome)

    say("up again on the same volumes")
    stack.up()
    healthy = stack.wait_healthy()
    say(f"every container healthy in {healthy:.1f}s")
    outcome.figures["second_healthy_s"] = round(healthy, 1)
    problems = asyncio.run(tokens_still_work(stack.urls(), kept))
    say(f"the first run's tokens: access token and sync token {'work' if not problems else 'FAIL'}")
    outcome.check("tokens", problems)


def figures_of(report: LoadReport) -> dict[str, Any]:
    return {
        "acknowledged": report.events_sent, "checked": report.events_checked, **classify(report.problems),
        "answered_500": report.internal_errors, "failed_actions": report.failed,
        "seconds": round(report.seconds, 1),
        "events_per_s": round(report.events_per_s, 1),
    }  # fmt: skip


def show_load(report: LoadReport, outcome: Outcome, step: str) -> None:
    kinds = classify(report.problems)
    say(f"{step}: {report.events_sent} events acknowledged, {report.events_checked} checked in"
        f" {report.syncs} syncs; lost {kinds['lost']}, duplicated {kinds['duplicated']}, reordered"
        f" {kinds['reordered']}, other {kinds['other']}; answered 500: {report.internal_errors};"
        f" {report.failed} actions failed (a crashed worker's in-flight requests);"
        f" {report.events_per_s:.0f} events/s")  # fmt: skip
    problems = list(report.problems[:10])
    if report.internal_errors:
        problems.append(f"{report.internal_errors} answers with status 500 (a fault must be answered 503)")
    if not report.events_sent or not report.events_checked:
        problems.append("the load acknowledged or checked no event")
    outcome.check(step, problems)


@dataclass(frozen=True)
class Kept:
    """What the first run leaves a client with: a user's access token and sync token, its room."""

    user_id: str
    token: str
    since: str
    room: str
    sync_worker: str


def _plan(options: Options, seed: int) -> LoadPlan:
    return LoadPlan(users=options.users, rooms=options.rooms, actions=options.actions,
                    concurrency=options.concurrency, expect_ephemeral=True, seed=seed)  # fmt: skip


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))


async def steady_load(stack: Stack, urls: dict[str, str], options: Options) -> tuple[LoadReport, Kept]:
    sync_workers = sorted(n for n in urls if n.startswith("sync-"))
    async with _session() as session:
        driver = LoadDriver(session, urls, EVENT_WRITERS, sync_workers, stack.database_url, _plan(options, 7))
        await driver.setup()
        report = await driver.run(_progress(options.actions))
        if report.problems:
            await keep_for_diagnosis(driver, options.workdir)
        owner = driver.clients[0]
        since = (await owner.sync(sync_workers[0]))["next_batch"]
        kept = Kept(str(owner.user_id), str(owner.token), str(since), driver.rooms[0], sync_workers[0])
    return report, kept


def _progress(total: int) -> Callable[[int, int, str], None]:
    shown = -1

    def progress(done: int, _total: int, note: str) -> None:
        nonlocal shown
        tenth = 10 * done // max(total, 1)
        if tenth != shown:
            shown = tenth
            print(f"    {done}/{total} actions  {note}", flush=True)

    return progress


async def faulted_load(stack: Stack, options: Options) -> tuple[dict[str, Any], LoadReport]:
    urls = stack.urls()
    sync_workers = sorted(n for n in urls if n.startswith("sync-"))
    figures: dict[str, Any] = {}
    async with _session() as session:
        plan = _plan(options, 11)
        driver = LoadDriver(session, urls, EVENT_WRITERS, sync_workers, stack.database_url, plan)
        await driver.setup()
        load = asyncio.create_task(driver.run(_progress(options.actions)))
        await _until(lambda: driver.report.events_sent >= options.actions / 12 or load.done(), 300, "load")
        crashed = [stack.container(name) for name in CRASHED]
        before = {c.name: stack.restarts(c) for c in crashed}
        for container in crashed:
            stack.crash(container)
        killed = time.monotonic()
        say(f"  SIGKILLed {', '.join(before)} at {driver.report.events_sent} events")
        restarted = lambda: all(stack.restarts(c) > before[c.name] for c in crashed)  # noqa: E731
        await _until(restarted, 60, "restart policy")  # the engine has seen them die
        await asyncio.to_thread(stack.wait_healthy, 180, [c.name for c in crashed])
        restarts = {c.name: stack.restarts(c) - before[c.name] for c in crashed}
        figures["crash_recovery_s"] = round(time.monotonic() - killed, 1)
        figures["restarts"] = restarts
        say(f"  back by the restart policy ({restarts} restarts) and healthy {figures['crash_recovery_s']}s"
            " after the kill")  # fmt: skip
        if any(count < 1 for count in restarts.values()):
            raise StepFailed(f"the restart policy did not restart {restarts}")
        redis = stack.container("redis")
        started = time.monotonic()
        await asyncio.to_thread(docker, "restart", redis.id)
        say(f"  docker restart redis at {driver.report.events_sent} events")
        await asyncio.to_thread(stack.wait_healthy, 180)
        figures["redis_recovery_s"] = round(time.monotonic() - started, 1)
        say(f"  every container healthy {figures['redis_recovery_s']}s after the Redis restart")
        if load.done():
            say("  (the load had ended before the restart: make --actions larger to restart under load)")
        report = await load
        if report.problems:
            await keep_for_diagnosis(driver, options.workdir, "faults")
    return figures, report


async def _until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise StepFailed(f"waited {timeout_s:g}s for the {what} in vain")
        await asyncio.sleep(0.05)


def audit(stack: Stack, outcome: Outcome) -> None:
    say("audit: docker-compose --profile audit run --rm audit (Spark against the stack's database)")
    started = time.monotonic()
    result = stack.compose("--profile", "audit", "run", "--rm", "-T", "audit", timeout=900, check=False)
    seconds = time.monotonic() - started
    (stack.workdir / "audit.log").write_text(result.stdout + result.stderr)
    listing = run(
        ["docker", "run", "--rm", "--network", "none", "-v", f"{stack.project}_audit:/data:ro",
         "--entrypoint", "find", "fanout-audit:bookworm", "/data", "-type", "f"], check=False,
    ).stdout.split()  # fmt: skip
    names = sorted({Path(p).name for p in listing if not Path(p).name.startswith((".", "part-", "_"))})
    say(f"audit: exit {result.returncode} in {seconds:.0f}s; {len(listing)} files in the audit volume,"
        f" among them {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}")  # fmt: skip
    outcome.figures["audit"] = {"exit": result.returncode, "seconds": round(seconds), "files": len(listing)}
    problems = []
    if result.returncode != 0:
        problems.append(f"the audit exited {result.returncode} (its output: {stack.workdir}/audit.log)")
    if not listing:
        problems.append("the audit wrote nothing to its volume")
    outcome.check("audit", problems)


def stop_all(stack: Stack, outcome: Outcome) -> None:
    say("docker-compose stop: SIGTERM to every container, SIGKILL after its grace period (workers 20s)")
    containers = stack.containers()
    started = datetime.datetime.now(datetime.UTC)
    stack.stop()
    codes: dict[str, Any] = {}
    problems = []
    for container in containers:
        code = int(stack.inspect(container, "{{.State.ExitCode}}"))
        took = (stack.finished_at(container) - started).total_seconds()
        codes[container.name] = {"exit": code, "seconds": round(took, 1)}
        if container.service in WORKERS and code != 0:
            problems.append(f"{container.name} exited {code} (137: killed after its grace period)")
    say("stopped: " + ", ".join(f"{n} exit {c['exit']} in {c['seconds']}s" for n, c in codes.items()))
    outcome.figures["stop"] = codes
    outcome.check("stop", problems)


async def tokens_still_work(urls: dict[str, str], kept: Kept) -> list[str]:
    """The first run's user, with its access token, sends to its room; its sync token of the first
    run, given to a sync worker, brings that message (and nothing is refused)."""
    async with _session() as session:
        client = ClusterClient(session, urls, EVENT_WRITERS, user_id=kept.user_id, token=kept.token)
        seen: list[str] = []
        try:
            sent = await client.send(kept.room, "m.room.message", {"body": "after the restart"})
            since, deadline = kept.since, time.monotonic() + 30
            while sent["event_id"] not in seen and time.monotonic() < deadline:
                answer = await client.sync(kept.sync_worker, since=since, timeout_ms=5000)
                room = answer.get("rooms", {}).get("join", {}).get(kept.room, {})
                seen += [e.get("event_id") for e in room.get("timeline", {}).get("events", [])]
                since = answer["next_batch"]
        except Exception as e:  # the check's finding, not a crash of the run
            return [f"the first run's tokens were refused: {type(e).__name__}: {e}"[:300]]
    if sent["event_id"] not in seen:
        return [f"syncing on from the first run's sync token did not bring {sent['event_id']} within 30s"]
    return []
