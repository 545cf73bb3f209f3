"""`fanout services up`: both servers answer, and no process survives SIGINT or our own SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import redis.asyncio as aioredis


def _children(pid: int) -> set[int]:
    """Every live descendant of `pid`, from /proc."""
    parent_of: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent_of[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parent_of.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start() -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "services", "up"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    urls: dict[str, str] = {}
    for line in proc.stdout:
        name, _, value = line.partition(":")
        if name in ("postgres", "redis"):
            urls[name] = value.strip()
        if line.startswith("ready"):
            break
    assert set(urls) == {"postgres", "redis"}, proc.stderr.read() if proc.stderr else ""
    return proc, urls["postgres"], urls["redis"]


def _wait_gone(pids: set[int], timeout: float = 15.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = {p for p in pids if _alive(p)}
        if not left:
            return set()
        time.sleep(0.1)
    return {p for p in pids if _alive(p)}


async def test_services_up_answers_and_sigint_leaves_nothing() -> None:
    proc, pg_url, redis_url = _start()
    try:
        conn = await asyncpg.connect(pg_url)
        assert await conn.fetchval("SELECT count(*) FROM generate_series(1, 10)") == 10
        await conn.close()
        client = aioredis.from_url(redis_url)
        assert await client.ping() is True
        await client.aclose()
        children = _children(proc.pid)
        assert len(children) >= 2  # postgres (and its backends) and the redis server
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert _wait_gone(children) == set()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_stops_cleanly() -> None:
    proc, _, _ = _start()
    children = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert _wait_gone(children) == set()


def test_sigkill_of_parent_still_stops_servers() -> None:
    """PR_SET_PDEATHSIG: the kernel stops the servers when their parent dies without cleaning up."""
    proc, _, _ = _start()
    children = _children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert _wait_gone(children) == set()


def test_a_stop_signal_sent_as_soon_as_it_says_ready_is_not_missed() -> None:
    """The signal may land before the process waits for it (a loaded machine descheduled it just
    after "ready"): it must still stop, not wait for another (a run saw 30 s of nothing)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
        proc, _, _ = _start()
        children = _children(proc.pid)
        proc.send_signal(signum)
        try:
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert _wait_gone(children) == set()
