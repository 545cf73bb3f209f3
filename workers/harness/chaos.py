"""The fault scenarios' report: each scenario appends one line of JSON, `make chaos` prints the table.

A scenario (tests/cluster/test_scenarios.py) runs a cluster of real worker processes under load,
applies a fault, and checks every reader's history (workers.harness.history). `record` turns its
outcome into one row: events acknowledged (sends answered 200), events checked (the visible events
the readers' histories were checked against), lost, duplicated and reordered deliveries (from the
checker's findings), answers with status 500 (a fault is answered 503, never 500), actions
answered 5xx or not at all, the longest a room write took to be answered (a send waits while its
room moves to another persister), and the time from the end of the fault until every worker was
ready again.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

#: Where scenarios append their rows (unset: nowhere; `make chaos` sets it).
REPORT_ENV = "FANOUT_CHAOS_REPORT"
#: How much larger than CI the loads and outages are (`make chaos` sets it; CI runs 1).
SCALE_ENV = "FANOUT_CHAOS_SCALE"


def scale() -> int:
    return max(1, int(os.environ.get(SCALE_ENV, "1")))


def classify(problems: list[str]) -> dict[str, int]:
    """The history checker's findings by kind."""
    kinds = {"lost": 0, "duplicated": 0, "reordered": 0, "other": 0}
    for line in problems:
        if ": missed " in line:
            kinds["lost"] += 1
        elif "delivered twice" in line:
            kinds["duplicated"] += 1
        elif "not in stream order" in line:
            kinds["reordered"] += 1
        else:
            kinds["other"] += 1
    return kinds


def record(
    scenario: str,
    acknowledged: int,
    checked: int,
    problems: list[str],
    recovery_s: float,
    internal_errors: int = 0,
    longest_write_ms: float | None = None,
    failed: int | None = None,
) -> dict[str, Any]:
    row = {"scenario": scenario, "acknowledged": acknowledged, "checked": checked, **classify(problems),
           "internal_errors": internal_errors, "recovery_s": round(recovery_s, 2),
           "longest_write_ms": longest_write_ms, "failed": failed}  # fmt: skip
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a") as report:
            report.write(json.dumps(row) + "\n")
    return row


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = [
        "| scenario | events acknowledged | events checked | lost | duplicated | reordered | other"
        " | answered 500 | answered 5xx or not at all | longest room write | time to recover |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['scenario']} | {r['acknowledged']:,} | {r['checked']:,} | {r['lost']} | {r['duplicated']} |"
        f" {r['reordered']} | {r['other']} | {r.get('internal_errors', 0)} | {_maybe(r.get('failed'))} |"
        f" {_maybe(r.get('longest_write_ms'), ' ms')} | {r['recovery_s']:.1f} s |"
        for r in rows
    ]
    return "\n".join(lines)


def _maybe(value: float | None, unit: str = "") -> str:
    """A figure, or a dash for rows recorded before it was measured."""
    return "-" if value is None else f"{value:,.0f}{unit}"


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
