"""Where a worker's CPU time goes: a sampling profiler on the process's own CPU clock.

py-spy samples a process whenever it is runnable. On a machine whose cores are full, a process
is often runnable but not running: preempted, most often right after a socket write woke the
process it wrote to (PostgreSQL, Redis, an HTTP client). py-spy then charges that wait to the
write, so a saturated worker's profile shows "half of it is socket writes" while /proc says its
system time is a tenth of its CPU. This profiler counts CPU instead: `ITIMER_PROF` sends SIGPROF
after each millisecond of the process's CPU time, and the handler weighs the Python stack it
interrupts by the CPU the main thread used since the previous sample. A sample the interpreter
could not take at once (C code ran: asyncpg's protocol, uvloop's loop, a JSON encoder) is
counted in the next, charged to the Python frame that called that C code, or to the event
loop's `run` for uvloop's own work between callbacks. So the shares are of CPU, and they add up
to the CPU /proc reports for the main thread. Sampling costs CPU too (3-13 % more in a loop 35
frames deep, measured alternated): a profiled run's figures are above a plain one's.

A worker runs under it with `python -m workers.harness.bench.cpu_sampler OUT NAME -- worker
--config FILE` (`LocalCluster(cpu_profile=OUT)` starts every worker so). It records only between
SIGUSR1 (start, clearing what was recorded) and SIGUSR2 (stop): then it writes `OUT/NAME.stacks`
in py-spy's raw format (`frame;frame;... count`, the count in microseconds of CPU), which
`profile.summarize` reads. A production worker never imports this module.
"""

from __future__ import annotations

import atexit
import runpy
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from types import FrameType

#: Seconds of process CPU between samples.
INTERVAL_S = 0.001


class CpuSampler:
    """Collapsed Python stacks of the main thread, weighted by the CPU time it spent in them."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.recording = False
        self.stacks: Counter[str] = Counter()
        self._last = time.thread_time()

    def install(self) -> None:
        signal.signal(signal.SIGPROF, self._sample)
        signal.signal(signal.SIGUSR1, self._start)
        signal.signal(signal.SIGUSR2, self._stop)
        signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)
        # Before the interpreter puts the default action (terminate) back on SIGPROF at exit.
        atexit.register(signal.setitimer, signal.ITIMER_PROF, 0)

    def _sample(self, signum: int, frame: FrameType | None) -> None:
        now = time.thread_time()
        spent, self._last = now - self._last, now
        if not self.recording or frame is None:
            return
        names = []
        while frame is not None:
            code = frame.f_code
            names.append(f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})")
            frame = frame.f_back
        names.reverse()
        self.stacks[";".join(names)] += round(spent * 1_000_000)

    def _start(self, signum: int, frame: FrameType | None) -> None:
        self.stacks.clear()
        self._last = time.thread_time()
        self.recording = True

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.recording = False
        written = self.out.with_suffix(".tmp")
        with written.open("w") as f:
            for stack, micros in self.stacks.items():
                if micros:
                    f.write(f"{stack} {micros}\n")
        written.replace(self.out)  # whole or not at all: the reader waits for this name


def main(argv: list[str]) -> None:
    """`OUT NAME -- ARGS...`: run `workers.cli ARGS...` sampled, stacks to `OUT/NAME.stacks`."""
    if len(argv) < 3 or argv[2] != "--":
        raise SystemExit("usage: python -m workers.harness.bench.cpu_sampler OUT NAME -- ARGS...")
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    CpuSampler(out / f"{argv[1]}.stacks").install()
    sys.argv = ["workers.cli", *argv[3:]]
    runpy.run_module("workers.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
