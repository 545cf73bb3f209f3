"""The compatibility recorder works, so the next release can record its own fixtures: a real run
into a temporary directory writes the layout tests/compat reads (HEAD's streams, which may be more
than the previous release's there), each line this release's parser takes, a row of every stream
and a token after every step."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from pubsub.wire import RData, parse_line
from tests.conftest import Servers
from workers.storage import connect


async def test_the_recorder_writes_the_layout_tests_compat_reads(servers: Servers, tmp_path: Path) -> None:
    """The command as docs/operations.md ("Releasing") gives it, on the session's servers; it
    drops the scratch database it made."""
    databases = r"SELECT count(*) FROM pg_database WHERE datname LIKE 'compat\_%'"
    async with connect(servers.admin_url) as conn:
        before = await conn.fetchval(databases)
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "workers.harness.compat", "--out", str(tmp_path / "out"),
         "--database-url", servers.admin_url, "--redis-url", servers.redis_url],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("recorded account_data "), result.stdout
    async with connect(servers.admin_url) as conn:
        assert await conn.fetchval(databases) == before
    wire = tmp_path / "out" / "wire"
    streams = sorted(p.stem for p in (wire / "streams").glob("*.lines"))
    assert {"events", "caches", "typing", "presence"} <= set(streams)
    for stream in streams:
        lines = (wire / "streams" / f"{stream}.lines").read_text().splitlines()
        commands = [parse_line(line) for line in lines]
        assert any(isinstance(c, RData) for c in commands), stream
    assert sorted(json.loads((wire / "channels.json").read_text())) == streams
    for line in (wire / "cluster.lines").read_text().splitlines():
        parse_line(line)
    tokens = json.loads((tmp_path / "out" / "tokens.json").read_text())
    assert set(tokens) == {"release", "sync_streams", "instance_map", "tokens"}
    assert len(tokens["tokens"]) > 10
