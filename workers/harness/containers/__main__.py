"""`python -m workers.harness.containers` (`make containers`): the stack built and run on Docker.

Exit 0 when every step passed, 1 when a check found a problem, 2 when a step could not run (no
engine, a failed build): one line says which.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from workers.harness.bench._common import positive_int
from workers.harness.containers.commands import StepFailed, say
from workers.harness.containers.scenario import Options, run_all

REPO = Path(__file__).resolve().parents[3]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="make containers", description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=positive_int, default=24)
    p.add_argument("--rooms", type=positive_int, default=8)
    p.add_argument("--actions", type=positive_int, default=1500, help="actions of each of the two loads")
    p.add_argument("--concurrency", type=positive_int, default=16)
    p.add_argument("--workdir", type=Path, help="logs and the summary (default: a new temporary directory)")
    args = p.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fanout-containers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"logs and summary in {workdir}")
    options = Options(REPO, workdir, args.users, args.rooms, args.actions, args.concurrency)
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the stack and a dockerd started here go.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    started = time.monotonic()
    try:
        outcome = run_all(options)
    except StepFailed as e:
        print(f"containers: FAILED: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("containers: interrupted; the stack was removed", file=sys.stderr, flush=True)
        return 130
    outcome.figures["seconds"] = round(time.monotonic() - started)
    summary = {**outcome.figures, "problems": outcome.problems}
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    verdict = "PASSED" if not outcome.problems else f"FAILED ({len(outcome.problems)} problems)"
    say(f"{verdict} in {outcome.figures['seconds']}s; summary {workdir / 'summary.json'}")
    for problem in outcome.problems:
        say(f"  - {problem}")
    return 0 if not outcome.problems else 1


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
