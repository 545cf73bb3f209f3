"""CPU profiles of worker processes during a benchmark, and their summary.

A benchmark that profiles starts its cluster with `LocalCluster(cpu_profile=sampled_dir(DIR))`
(`DIR` its `--profile`), so that every worker runs under `workers.harness.bench.cpu_sampler`
(samples on the process's own CPU clock, not on the wall: see that module for why py-spy misleads
on a full machine).
`recorder(cluster)(phase)` starts a recording of its workers at once; `Profiles.wait()` ends
it and writes, per worker, `<name>.stacks` (collapsed stacks, microseconds of CPU) and
`<name>.txt`, whose `summarize` gives the CPU by activity, then self time and time inside
(inclusive) per function, as shares of the recorded CPU. `wait()` blocks until the workers have
written (milliseconds): it runs between a benchmark's phases, never inside a measured window.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.harness.cluster import LocalCluster

#: How long a worker has to write its stacks once told to stop.
WRITE_TIMEOUT_S = 10.0


class Profiles:
    """A recording of workers that run under the CPU sampler: started when made, ended by `wait`."""

    def __init__(self, sampled: Path, pids: dict[str, int], out: Path) -> None:
        self._sampled = sampled
        self._pids = pids
        self._out = out
        for name, pid in pids.items():
            (sampled / f"{name}.stacks").unlink(missing_ok=True)
            os.kill(pid, signal.SIGUSR1)

    def wait(self) -> list[Path]:
        """End the recording; write `<name>.stacks` and `<name>.txt` into `out`; the summaries."""
        for pid in self._pids.values():
            os.kill(pid, signal.SIGUSR2)
        self._out.mkdir(parents=True, exist_ok=True)
        written = []
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        for name in self._pids:
            source = self._sampled / f"{name}.stacks"
            while not source.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} wrote no CPU profile to {source}")
                time.sleep(0.05)
            stacks = source.replace(self._out / source.name)
            summary = stacks.with_suffix(".txt")
            summary.write_text(f"{name}\n{summarize(stacks)}")
            written.append(summary)
        return written


def sampled_dir(profile: str | Path | None) -> Path | None:
    """For a benchmark's `--profile DIR`, its cluster's `cpu_profile`: where the sampled workers
    write their stacks (`DIR/sampled`); None without `--profile`."""
    return None if profile is None else Path(profile) / "sampled"


def recorder(cluster: LocalCluster, names: Iterable[str] | None = None) -> Callable[[str], Profiles] | None:
    """The function that starts a recording of a phase, of the cluster's workers `names` (every
    running one by default); their profiles go to `DIR/<phase>` beside `DIR/sampled`. None when
    the cluster's workers run unsampled (no `cpu_profile`)."""
    sampled = cluster.cpu_profile
    if sampled is None:
        return None
    pids = cluster.pids if names is None else {name: cluster.pids[name] for name in names}
    return lambda phase: Profiles(sampled, pids, sampled.parent / phase)


#: What a worker's CPU is spent on: a stack's activity is the first of these that names a frame
#: in it (in this order: a /sync answer's stack also holds aiohttp's frames). A stack with none
#: is "other" (timers, callbacks of their own), or uvloop's own work when it ends in `run`.
ACTIVITIES = (
    ("/sync handler", ("sync (handler.py)",)),
    ("send handler", ("send (rooms.py)", "send (writes.py)")),
    (
        "HTTP around the handlers (aiohttp, middlewares, other routes)",
        (
            "_handle_request (web_protocol.py)",
            "data_received (web_protocol.py)",
            "start (web_protocol.py)",
            "finish_response (web_protocol.py)",
        ),
    ),
    ("persist batches", ("_run_batch (persist.py)", "_run (persist.py)")),
    (
        "replication received",
        ("_read_loop (redis_transport.py)", "consume (stream_queue.py)", "handle_lines (handler.py)"),
    ),
    ("replication published", ("_run (publisher.py)", "flush (publisher.py)")),
)


def activity(names: list[str]) -> str:
    """The activity (`ACTIVITIES`) of a stack of short frame names, outermost first."""
    for label, frames in ACTIVITIES:
        if any(name in frames for name in names):
            return label
    return "event loop's own (uvloop)" if names and names[-1] == "run (runners.py)" else "other"


def summarize(stacks: Path, top: int = 25) -> str:
    """The CPU by activity, then the functions holding the most, by self time and time inside."""
    own: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    by_activity: collections.Counter[str] = collections.Counter()
    total = 0
    for line in stacks.read_text().splitlines():
        frames, _, count_text = line.rpartition(" ")
        if not frames or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        names = [_short(f) for f in frames.split(";")]
        own[names[-1]] += count
        by_activity[activity(names)] += count
        for name in set(names):
            inside[name] += count
    if not total:
        return "no samples\n"
    lines = [f"{total / 1000:,.0f} ms of CPU", "", "by activity:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in by_activity.most_common()]
    lines += ["", "self time:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    lines += ["", "time inside (inclusive):"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inside.most_common(top)]
    return "\n".join(lines) + "\n"


def _short(frame: str) -> str:
    """`function (path/to/module.py:123)` -> `function (module.py)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.split(':')[0]).name})" if where else name
