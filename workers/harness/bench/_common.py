"""What every benchmark shares: progress lines, the one percentile rule, scratch databases, figures.

A benchmark module is one `fanout bench NAME`: its `main(argv)` prints one JSON document on stdout
(the raw result) and a readable table on stderr, and its `figures(result)` turns that document
into `Figure`s: a measured value beside the ceiling measured in the same run and the target.
`fanout bench all` (all.py) collects those into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from workers.harness.cluster import LocalCluster


def report(result: dict[str, Any], figures: Callable[[dict[str, Any]], Sequence[Figure]]) -> None:
    """A benchmark's end: its result as JSON on stdout, then each of its figures as a line on stderr."""
    print(json.dumps(result, indent=2))
    for figure in figures(result):
        progress(figure.line())


def beside_ceiling(
    args: argparse.Namespace,
    result: dict[str, Any],
    ceiling: Callable[[argparse.Namespace], Coroutine[Any, Any, Any]],
    fanout: Callable[[argparse.Namespace, str, str], Coroutine[Any, Any, Any]],
    figures: Callable[[dict[str, Any]], Sequence[Figure]],
) -> int:
    """Run `ceiling(args)` into `result["ceiling"]`, then `fanout(args, admin URL, Redis URL)` into
    `result["fanout"]` (on the servers `--database-url` and `--redis-url` name, embedded ones for
    those not given), then `report` it."""
    from workers.embedded.services import given_or_embedded
    from workers.process import event_loop

    progress("ceiling: the same clients against a bare server")
    result["ceiling"] = event_loop.run(ceiling(args))
    progress("fanout")
    with given_or_embedded(args.database_url, args.redis_url) as (admin_url, redis_url):
        result["fanout"] = event_loop.run(fanout(args, admin_url, redis_url))
    report(result, figures)
    return 0


@asynccontextmanager
async def bench_cluster(
    admin_url: str,
    redis_url: str,
    tag: str,
    *,
    persisters: int,
    sync_workers: int,
    cpu_profile: Path | None = None,
) -> AsyncIterator[LocalCluster]:
    """A started `LocalCluster` (no background worker) on a fresh database and its own channel
    prefix; stopped on leaving. `cpu_profile`: the workers run under the CPU sampler
    (`workers.harness.bench.profile`)."""
    cluster = LocalCluster(
        await scratch_database(admin_url, tag),
        redis_url,
        Path(tempfile.mkdtemp(prefix=f"fanout-bench-{tag}-")),
        persisters=persisters,
        sync_workers=sync_workers,
        background_workers=0,
        channel_prefix=f"bench-{uuid.uuid4().hex[:6]}",
        cpu_profile=cpu_profile,
    )
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop()


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def progress(message: str) -> None:
    """One progress line on stderr (stdout carries the JSON result)."""
    print(message, file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile, `q` in percent: the smallest value such that at least q% of the
    values are at or below it (p50 of 1..4 is 2, p99 of 100 values is the 99th). NaN when empty.
    Every benchmark uses this one rule, so their p50 and p99 compare."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def latency_ms(values_ms: Sequence[float]) -> dict[str, float]:
    """How many, p50, p99 and max of latencies in milliseconds (rounded to 0.01 ms; NaN when none)."""
    return {
        "samples": len(values_ms),
        "p50_ms": round(percentile(values_ms, 50), 2),
        "p99_ms": round(percentile(values_ms, 99), 2),
        "max_ms": round(max(values_ms, default=float("nan")), 2),
    }


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far apart repeated measurements of one thing fell."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else float("nan")


def database_url(admin_url: str, name: str) -> str:
    """The URL of database `name` on the server of `admin_url`."""
    return f"{admin_url.rpartition('/')[0]}/{name}"


async def scratch_database(admin_url: str, tag: str, *, migrate: bool = True) -> str:
    """Create a fresh database `bench_<tag>_<random>` next to `admin_url` (migrated unless told
    not to) and return its URL; `drop_database` removes it."""
    name = f"bench_{tag}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    url = database_url(admin_url, name)
    if migrate:
        from workers.storage.migrate import migrate_url

        await migrate_url(url)
    return url


async def drop_database(admin_url: str, url: str) -> None:
    """Drop the database `url` names (connections to it are ended first)."""
    name = url.rpartition("/")[2].partition("?")[0]
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


@dataclass(frozen=True)
class Figure:
    """One measured figure beside its ceiling (measured in the same run) and its target.

    `ratio` is value / ceiling unless the benchmark gives its own (for example the median of
    paired slices, steadier than a ratio of medians on a noisy machine). `target` reads as text
    ("ratio >= 0.5", "< 200 MB"); `met` is None when the figure has no target.

    `ceiling_met` says whether the ceiling itself meets an absolute target (None: not asked, or a
    target relative to the ceiling). A target the ceiling misses too is out of reach in this run
    (a floor: the bare server does less than any server doing the same work), and is reported so
    rather than as a plain miss."""

    benchmark: str
    name: str
    value: float
    unit: str
    ceiling: float | None = None
    target: str = ""
    met: bool | None = None
    ratio: float | None = None
    ceiling_met: bool | None = None

    @property
    def out_of_reach(self) -> bool:
        """Not met, and the ceiling measured in the same run does not meet the target either."""
        return self.met is False and self.ceiling_met is False

    def verdict(self) -> str:
        """'met', 'NOT met', or 'out of reach' (the ceiling misses the target too)."""
        if self.met:
            return "met"
        if self.out_of_reach:
            return f"out of reach: the ceiling ({_number(self.ceiling, self.unit)}) misses it too"
        return "NOT met"

    def __post_init__(self) -> None:
        if self.ratio is None and self.ceiling and not math.isnan(self.ceiling):
            object.__setattr__(self, "ratio", self.value / self.ceiling)

    def line(self) -> str:
        """The figure as one line of a benchmark's report."""
        text = f"{self.name}: {_number(self.value, self.unit)}"
        if self.ceiling is not None:
            text += f" beside {_number(self.ceiling, self.unit)}"
        if self.ratio is not None:
            text += f" (ratio {self.ratio:.2f})"
        if self.target:
            text += f"; target {self.target}: {self.verdict()}"
        return text


def _number(value: float | None, unit: str = "") -> str:
    if value is None or math.isnan(value):
        return "-"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def markdown_table(figures: Sequence[Figure], previous: Mapping[tuple[str, str], float] | None = None) -> str:
    """The figures as one Markdown table: benchmark, figure, value, ceiling, ratio, target, met;
    with `previous` (value by benchmark and figure name, from an earlier run), a `previous`
    column after the value ("-" for a figure that run did not have)."""
    before = previous is not None
    lines = [
        "| benchmark | figure | value |"
        + (" previous |" if before else "")
        + " ceiling | ratio | target | met |",
        "|---|---|---:|" + ("---:|" if before else "") + "---:|---:|---|---|",
    ]
    for f in figures:
        met = {True: "yes", False: "**no**", None: ""}[f.met]
        if f.out_of_reach:
            met = "out of reach (the ceiling misses it too)"
        ratio = "-" if f.ratio is None else f"{f.ratio:.2f}"
        earlier = f" {_number(previous.get((f.benchmark, f.name)), f.unit)} |" if previous is not None else ""
        lines.append(
            f"| {f.benchmark} | {f.name} | {_number(f.value, f.unit)} |{earlier} {_number(f.ceiling, f.unit)}"
            f" | {ratio} | {f.target} | {met} |"
        )
    return "\n".join(lines)


def machine() -> str:
    """One line naming the machine a run was measured on."""
    model = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(
                (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), ""
            )
    except OSError:
        pass
    cpu = model or platform.processor() or "unknown CPU"
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}"


def process_switches(pid: int) -> int:
    """Context switches of process `pid` so far, of all its threads (voluntary: it blocked, in
    epoll or a lock; involuntary: it was preempted). Per event, the times each process is woken:
    on this machine a wake-up costs more than most of the Python it runs."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:  # a thread that ended meanwhile
            continue
        total += sum(int(line.split()[1]) for line in lines if "ctxt_switches:" in line)
    return total


def process_cpu_s(pid: int) -> float:
    """CPU seconds of process `pid` so far: the scheduler's nanosecond count of each of its threads
    (`/proc/<pid>/task/*/schedstat`), or, where the kernel keeps none, user + system time. Those
    come in 10 ms clock ticks: a worker spending 100 ms over a 30-s run at 10 events/s read a tenth
    either way between runs of the same tree. A thread that ended takes its count with it (a
    worker's threads are its event loop's and idle helpers)."""
    total = 0
    for stats in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stats.read_text().split()[0])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    if total:
        return total / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_usage(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds so far: `process_cpu_s`) of process `pid`."""
    rss = next(
        int(line.split()[1]) / 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return rss, process_cpu_s(pid)
