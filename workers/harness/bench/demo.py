"""`fanout bench demo`: the demo's mixed load, as `make demo` drives it, measured as a benchmark.

The same cluster (2 persisters, 2 sync workers, 1 background worker) and the same load as
`fanout demo` (workers/harness/demo.py, without the audit): users joining, leaving and churning
membership, sending, redacting, typing, setting presence, receipts, account data, to-device and
keys, with every sync client's history checked. Persist-to-visible is the time from an event's
`origin_server_ts` to the moment the last sync worker's reader holding its room received it, so
it is the latency on *every* sync worker. There is no bare-server ceiling for a load this mixed;
the figure stands beside its target and the previous run's figure, and the cores the demo's own
clients used stand beside it, so that a run they bounded shows it. A run whose history check
failed reports its figures as not met, whatever they are.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from workers.embedded.services import given_or_embedded
from workers.harness.bench._common import Figure, progress, report

TARGET_P50_MS = 20.0
TARGET_P99_MS = 100.0


def figures(result: dict[str, Any]) -> list[Figure]:
    """Achieved events/s and actions/s, the clients' own cores, persist-to-visible p50 and p99 on
    every sync worker, and the check."""
    verified = bool(result["verified"])
    return [
        Figure("demo", "events/s achieved, the demo's mixed load", result["events_per_s"], "/s"),
        Figure("demo", "actions/s achieved (writes of every kind)", result["actions_per_s"], "/s"),
        Figure("demo", "cores used by the demo's own clients", result["client_cores"], "cores"),
        Figure(
            "demo", "persist-to-visible p50, every sync worker", result["latency_p50_ms"], "ms",
            target=f"<= {TARGET_P50_MS:.0f} ms", met=verified and result["latency_p50_ms"] <= TARGET_P50_MS,
        ),
        Figure(
            "demo", "persist-to-visible p99, every sync worker", result["latency_p99_ms"], "ms",
            target=f"<= {TARGET_P99_MS:.0f} ms", met=verified and result["latency_p99_ms"] <= TARGET_P99_MS,
        ),
        Figure(
            "demo", "history problems (lost, duplicated, reordered, ...)", float(len(result["problems"])), "",
            target="= 0", met=verified,
        ),
    ]  # fmt: skip


def main(argv: list[str]) -> int:
    from workers.harness.demo import add_load_arguments, demo_database_url, demo_summary

    p = argparse.ArgumentParser(prog="fanout bench demo", description=__doc__.split("\n\n")[0])
    add_load_arguments(p)
    p.add_argument("--profile", type=Path, metavar="DIR", help="profile each worker's CPU during the load")
    args = p.parse_args(argv)
    args.keep = False
    workdir = Path(tempfile.mkdtemp(prefix="fanout-bench-demo-"))
    progress(f"the demo's load: {args.actions} actions by {args.users} users in {args.rooms} rooms")
    with given_or_embedded(args.database_url, args.redis_url) as (server_url, redis_url):
        result = demo_summary(args, demo_database_url(args, server_url), redis_url, workdir)
    report(result, figures)
    return 0 if result["verified"] else 1
