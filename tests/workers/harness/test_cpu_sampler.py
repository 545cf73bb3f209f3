"""The CPU sampler counts CPU, not wall time, and `bench live --profile` records every worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from workers.harness.bench.profile import summarize

#: Run in a process of its own: the sampler takes SIGPROF, SIGUSR1 and SIGUSR2 for good.
BURN_AND_WAIT = """
import json, os, signal, sys, time
from pathlib import Path
from workers.harness.bench.cpu_sampler import CpuSampler

def burn(seconds):
    end = time.thread_time() + seconds
    n = 0
    while time.thread_time() < end:
        n += 1
    return n

def wait(seconds):
    time.sleep(seconds)

out = Path(sys.argv[1])
CpuSampler(out).install()
burn(0.05)  # not recorded yet
os.kill(os.getpid(), signal.SIGUSR1)
began = time.thread_time()
burn(0.3)
wait(0.5)
burn(0.1)
used = time.thread_time() - began
os.kill(os.getpid(), signal.SIGUSR2)
print(json.dumps({"used_s": used}))
"""


def _stacks(path: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, micros = line.rpartition(" ")
        found[stack] = found.get(stack, 0) + int(micros)
    return found


def test_the_sampler_charges_cpu_to_the_code_that_used_it_and_nothing_to_a_wait(tmp_path: Path) -> None:
    """0.4 s of CPU in `burn` and 0.5 s asleep in `wait`: the recording holds about 0.4 s, nearly
    all of it inside `burn`; the sleep, which a wall-clock sampler would show as the longest
    call, gets next to nothing; what ran before SIGUSR1 is not in it."""
    out = tmp_path / "w.stacks"
    run = subprocess.run(
        [sys.executable, "-c", BURN_AND_WAIT, str(out)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    used_us = json.loads(run.stdout)["used_s"] * 1_000_000
    stacks = _stacks(out)
    total = sum(stacks.values())
    in_burn = sum(us for stack, us in stacks.items() if "burn (<string>" in stack)
    in_wait = sum(us for stack, us in stacks.items() if "wait (<string>" in stack)
    assert 0.8 * used_us <= total <= 1.05 * used_us
    assert in_burn >= 0.9 * total
    assert in_wait <= 0.05 * total
    assert "100.0%  <module> (<string>)" in summarize(out)


def test_bench_live_profiles_each_worker_at_each_rate(tmp_path: Path) -> None:
    """`fanout bench live --profile DIR`: per rate, each worker's stacks and summary, whose CPU
    is that of its requests (the persisters' sends, the sync worker's /sync)."""
    run = subprocess.run(
        [sys.executable, "-m", "workers.cli", "bench", "live", "--rates", "20", "--seconds", "2",
         "--min-events", "40", "--rooms", "2", "--sender-processes", "1", "--reader-processes", "1",
         "--profile", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    phase = tmp_path / "20-per-s"
    for worker in ("persister1", "persister2", "sync1"):
        summary = (phase / f"{worker}.txt").read_text()
        assert summary.startswith(f"{worker}\n") and "ms of CPU" in summary and "by activity:" in summary
        assert sum(_stacks(phase / f"{worker}.stacks").values()) > 0
    # On failure: what sync1 recorded, and the bench's own figures for the rate (its CPU from /proc).
    why = f"{(phase / 'sync1.txt').read_text()[:600]}\n{run.stderr[-1500:]}"
    assert "handlers/sync/handler.py:" in (phase / "sync1.stacks").read_text(), why
    sends = "\n".join((phase / f"{w}.stacks").read_text() for w in ("persister1", "persister2"))
    assert "_persist_batch (" in sends
