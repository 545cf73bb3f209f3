"""A worker's way out, bounded: the shutdown steps run in order under one deadline.

An orchestrator kills a process that outlives its grace period (30 s by default), and a kill loses
what a clean stop does (rooms handed on at once, the last positions announced). So every step has
its own bound and the whole has `shutdown_timeout_s`, whatever the servers do: a step waits on its
task with `asyncio.wait` (which, unlike `wait_for`, does not wait for the cancellation to finish:
asyncpg's cancellation and pool release wait on the server, and a blackholed link never answers),
is cancelled when its bound passes and is left behind if it does not end within `CANCEL_GRACE_S`.
Steps after the deadline are skipped. A step that fails is logged and the next one runs.

`run_steps` returns what was skipped and what failed; the caller says so in one line and exits 1.
`exit_anyway` is the last resort for a loop that cannot run at all (a step blocking it): a thread
that ends the process when the deadline is long past.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

log = logging.getLogger(__name__)
#: How long a cancelled step may take to end before it is left behind.
CANCEL_GRACE_S = 0.5
#: Past the deadline by this much, `exit_anyway` ends the process.
HARD_EXIT_MARGIN_S = 2.0

Step = tuple[str, Callable[[], Awaitable[object]]]


@dataclass(slots=True)
class ShutdownOutcome:
    """What a shutdown did not finish: steps cut at their bound or not started for lack of time
    (`skipped`), and steps that raised (`failed`)."""

    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.skipped and not self.failed

    def describe(self) -> str:
        parts = [f"skipped {', '.join(self.skipped)}"] if self.skipped else []
        parts += [f"failed {', '.join(self.failed)}"] if self.failed else []
        return "; ".join(parts) or "clean"


async def run_steps(steps: Sequence[Step], *, total_s: float, step_s: float) -> ShutdownOutcome:
    """Run `steps` in order, each for at most `step_s` and all within `total_s` (see the module
    docstring); never raises for a step."""
    started = time.monotonic()
    deadline = started + total_s
    outcome = ShutdownOutcome()
    for name, step in steps:
        left = deadline - time.monotonic()
        if left <= 0:
            outcome.skipped.append(name)
            continue
        task = asyncio.ensure_future(step())
        done, _ = await asyncio.wait({task}, timeout=min(step_s, left))
        if task in done:
            error = task.exception()
            if error is not None:
                outcome.failed.append(name)
                log.error("shutdown step %s failed: %s: %s", name, type(error).__name__, error)
            continue
        outcome.skipped.append(name)
        log.error(
            "shutdown step %s took over %.1fs; skipping it (stack: %s)",
            name, min(step_s, left), task.get_stack(limit=8),
        )  # fmt: skip
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
        if not task.done():  # stuck in its own cancellation: leave it behind, retrieve it later
            task.add_done_callback(_retrieve)
    outcome.elapsed_s = time.monotonic() - started
    return outcome


def _retrieve(task: asyncio.Future[object]) -> None:
    if not task.cancelled():
        task.exception()


def exit_abandoning(code: int) -> NoReturn:
    """End the process now with `code`, logs and standard streams flushed: for a shutdown that
    skipped steps, whose abandoned tasks (a cancellation stuck in asyncpg on a cut link) the
    event loop's teardown would otherwise wait for until `exit_anyway`."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_anyway(after_s: float, what: str) -> threading.Timer:
    """Start a daemon timer that ends the process with exit code 1 after `after_s` seconds (the
    shutdown's deadline plus `HARD_EXIT_MARGIN_S`), saying so in one line. A process that exits
    by itself first takes the timer with it (a daemon thread)."""

    def end() -> None:
        print(
            f"fanout: {what} did not end within {after_s:.0f}s of the stop signal; exiting", file=sys.stderr
        )
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(after_s, end)
    timer.daemon = True
    timer.start()
    return timer
