"""The compatibility recorder works, so the next release can record its own fixtures: a real run
into a temporary directory writes the layout tests/compat reads (HEAD's streams, which may be more
than the previous release's there), each line this release's parser takes, a row of every stream
and a token after every step."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from pubsub.wire import RData, parse_line
from tests.conftest import Servers
from workers.harness.compat import record


async def test_the_recorder_writes_the_layout_tests_compat_reads(servers: Servers, tmp_path: Path) -> None:
    name = f"compat_{uuid.uuid4().hex[:12]}"
    url = await servers.create_database(name)
    try:
        recording = await record(url, servers.redis_url, tmp_path / "out", tmp_path / "work")
    finally:
        await servers.drop_database(name)
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
    assert len(tokens["tokens"]) == len(recording.tokens) > 10
