"""A real `fanout worker` process for tests: started from a config dict, ready when it says so."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import yaml

FANOUT = str(Path(sys.executable).parent / "fanout")


def start_worker(config: dict[str, Any], path: Path, timeout_s: float = 60.0) -> subprocess.Popen[str]:
    """Write `config` to `path`, run the worker, return once it printed its ready line."""
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    process = subprocess.Popen(
        [FANOUT, "worker", "--config", str(path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith("ready "):
            return process
        if not line and process.poll() is not None:
            raise AssertionError(
                f"worker exited {process.returncode}: {process.stderr.read() if process.stderr else ''}"
            )
    process.kill()
    raise AssertionError("worker not ready in time")


async def until_blocked_on_lock(conn: asyncpg.Connection[Any]) -> None:
    """Return once a backend of `conn`'s database waits for a lock another one holds (a worker's
    write held up by a lock the test took); AssertionError, naming what runs, after 30 s (a fresh
    clone's run beside another test once took over 10 s to get its write there)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0"
        ):
            return
        await asyncio.sleep(0.05)
    activity = await conn.fetch(
        "SELECT state, wait_event_type, left(query, 80) FROM pg_stat_activity"
        " WHERE datname = current_database()"
    )
    raise AssertionError(f"no write waits for the lock: {[tuple(r) for r in activity]}")
