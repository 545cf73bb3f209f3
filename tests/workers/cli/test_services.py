"""`fanout services up --data-dir DIR` as a real process, twice on the same directory: the second
start reuses the cluster (what the first wrote is there) and PostgreSQL is durable (fsync on);
`--only postgres` starts no Redis. A temporary directory says it runs with fsync off."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

FANOUT = str(Path(sys.executable).parent / "fanout")


def _up(*args: str) -> tuple[subprocess.Popen[str], list[str]]:
    process = subprocess.Popen(
        [FANOUT, "services", "up", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    lines = []
    while True:
        line = process.stdout.readline()
        assert line, f"exited {process.wait(10)}: {process.stderr.read() if process.stderr else ''}"
        lines.append(line.strip())
        if line.startswith("ready"):
            return process, lines


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0


def _url(lines: list[str]) -> str:
    return next(line.split(": ", 1)[1].strip() for line in lines if line.startswith("postgres:"))


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A directory outside pytest's own: as root, postgres runs as `nobody`, and a pytest session
    that starts meanwhile takes the traversal right from `/tmp/pytest-of-root` again (0700),
    which stopped initdb halfway in a run beside another session."""
    path = Path(tempfile.mkdtemp(prefix="fanout-services-"))
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)


async def test_a_kept_data_directory_is_reused_and_durable(data_dir: Path) -> None:
    first, lines = _up("--data-dir", str(data_dir), "--only", "postgres", "--migrate")
    try:
        assert not any(line.startswith("redis:") for line in lines)
        assert any("PostgreSQL durable" in line for line in lines)
        conn = await asyncpg.connect(_url(lines))
        await conn.execute("CREATE TABLE kept (value TEXT); INSERT INTO kept VALUES ('first run')")
        await conn.close()
    finally:
        _stop(first)
    second, lines = _up("--data-dir", str(data_dir), "--only", "postgres", "--migrate")
    try:
        conn = await asyncpg.connect(_url(lines))
        assert await conn.fetchval("SELECT value FROM kept") == "first run"
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            assert await conn.fetchval(f"SHOW {setting}") == "on"
        await conn.close()
    finally:
        _stop(second)


async def test_a_temporary_directory_says_it_is_unsafe() -> None:
    process, lines = _up("--only", "postgres")
    try:
        assert any("fsync, synchronous_commit and full_page_writes off" in line for line in lines)
        conn = await asyncpg.connect(_url(lines))
        assert await conn.fetchval("SHOW fsync") == "off"
        await conn.close()
    finally:
        _stop(process)
