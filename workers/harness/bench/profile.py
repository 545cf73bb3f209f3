"""Sampling profiles of worker processes during a benchmark (py-spy, from PyPI), and their summary.

`profile(pids, seconds, out)` starts one `py-spy record` per process for the length of a run and
returns a handle to wait on; `summarize(path)` reads py-spy's collapsed stacks and lists where
the samples were: self time per function, and time inside (inclusive) per function, each as a
share of the process's samples. Benchmarks pass `--profile DIR` to write both beside the figures.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
from pathlib import Path


class Profiles:
    def __init__(self, runs: list[tuple[str, Path, subprocess.Popen[bytes]]]) -> None:
        self._runs = runs

    def wait(self) -> list[Path]:
        """Wait for every recording; write `<name>.txt` summaries beside the stacks; their paths."""
        written = []
        for name, stacks, process in self._runs:
            process.wait()
            if stacks.exists():
                summary = stacks.with_suffix(".txt")
                summary.write_text(f"{name}\n{summarize(stacks)}")
                written.append(summary)
        return written


def profile(pids: dict[str, int], seconds: int, out: Path) -> Profiles:
    """Record each process (name -> pid) for `seconds` into `out/<name>.stacks`."""
    # Beside this interpreter first: the virtualenv's bin need not be on PATH.
    spy = shutil.which(
        "py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    if spy is None:
        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for name, pid in pids.items():
        stacks = out / f"{name}.stacks"
        command = [spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "250",
                   "--format", "raw", "--output", str(stacks), "--nonblocking"]  # fmt: skip
        runs.append(
            (name, stacks, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        )
    return Profiles(runs)


def summarize(stacks: Path, top: int = 25) -> str:
    """The functions holding the most samples, by self time and by time inside them."""
    own: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    total = 0
    for line in stacks.read_text().splitlines():
        frames, _, count_text = line.rpartition(" ")
        if not frames or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        names = [_short(f) for f in frames.split(";")]
        own[names[-1]] += count
        for name in set(names):
            inside[name] += count
    if not total:
        return "no samples\n"
    lines = [f"{total} samples", "", "self time:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    lines += ["", "time inside (inclusive):"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inside.most_common(top)]
    return "\n".join(lines) + "\n"


def _short(frame: str) -> str:
    """`function (path/to/module.py:123)` -> `function (module.py)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.split(':')[0]).name})" if where else name
