"""The previous release's replication lines and sync tokens, replayed against HEAD.

The files beside this one were recorded from the previous release by `workers.harness.compat` (its
docstring says how): one file per stream under `wire/streams/`, so a stream is covered by adding its
file (the next recording does that by itself), and `tokens.json`. HEAD must take every line as a
reader during a rolling upgrade would (rows with fields it does not know, streams it does not know:
skipped and counted, never rejected) and answer /sync for every recorded `next_batch`.

Streams held in the writer's memory (typing, presence) are caught up by asking the writer over
HTTP, and no writer runs here: for them the test checks what the wire carries (every row validated
by HEAD's row type, nothing rejected), not that the reader's positions reach the recorded ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import redis.asyncio as aioredis

from idgen import SyncToken
from pubsub.handler import ReplicationHandler
from pubsub.keys import base_channel
from pubsub.wire import Position, RData, parse_line
from workers.app import Worker
from workers.config import WorkerConfig
from workers.embedded.services import free_port
from workers.handlers.sync.handler import SYNC_STREAMS
from workers.harness.cluster_client import ClusterClient

COMPAT = Path(__file__).parent
STREAM_FILES = sorted((COMPAT / "wire" / "streams").glob("*.lines"))
RECORDED = json.loads((COMPAT / "tokens.json").read_text())
CHANNELS: dict[str, str] = json.loads((COMPAT / "wire" / "channels.json").read_text())

StartReader = Callable[..., Awaitable[Worker]]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _commands(path: Path) -> list[Any]:
    return [parse_line(line) for line in _lines(path)]


def _writers() -> dict[str, list[str]]:
    """Every recorded stream's writers, as the previous release's workers were configured."""
    return {
        path.stem: sorted({cmd.instance for cmd in _commands(path) if isinstance(cmd, RData | Position)})
        for path in STREAM_FILES
    }


async def _restore_sequences(database_url: str) -> None:
    """Stand in for the recorded database's sequences: its writers handed out the IDs the lines
    carry, so a reader's bound (a token is at most its stream's sequence) admits them."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "SELECT setval(format('%I', sequencename)::regclass, 1000000)"
            " FROM pg_sequences WHERE schemaname = 'public'"
        )
    finally:
        await conn.close()


@pytest.fixture
async def start_reader(database_url: str, redis_url: str, channel_prefix: str) -> AsyncIterator[StartReader]:
    """A HEAD worker that writes nothing and reads every recorded stream's writers (by default)."""
    started: list[Worker] = []

    async def start(stream_writers: dict[str, list[str]] | None = None) -> Worker:
        config = WorkerConfig(
            instance_name="head_reader", database_url=database_url, redis_url=redis_url,
            channel_prefix=channel_prefix, stream_writers=stream_writers or _writers(), http_port=free_port(),
            position_announce_interval_s=0.2, event_loop="asyncio", registration="open",
        )  # fmt: skip
        worker = Worker(config)
        started.append(worker)
        await worker.start()
        return worker

    yield start
    for worker in started:
        await worker.stop()


def test_every_recorded_line_parses() -> None:
    assert STREAM_FILES, "no recorded stream: run python -m workers.harness.compat"
    for path in [*STREAM_FILES, COMPAT / "wire" / "cluster.lines"]:
        for line in path.read_text().splitlines():
            parse_line(line)


async def _publish(redis_url: str, channel: str, lines: list[str]) -> None:
    """Publish `lines` in order, as their writers did."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        async with client.pipeline(transaction=False) as pipe:
            for line in lines:
                pipe.publish(channel, line)
            await pipe.execute()
    finally:
        await client.aclose()


def _with_a_newer_field(line: str, row_type: Any) -> str:
    """The line as the next release would send it, had it appended a field to HEAD's row: the
    trailing fields HEAD added since the recording (`row_type`'s, None: a stream HEAD lacks) at
    their defaults, then one HEAD does not know."""
    if not line.startswith("RDATA "):
        return line
    command = parse_line(line)
    assert isinstance(command, RData)
    recorded = len(json.loads(command.row_json)) - (0 if command.token is None else 2)
    fields = [] if row_type is None else list(row_type._fields)[recorded:]
    added = "".join(f",{json.dumps(row_type._field_defaults[f])}" for f in fields)
    return f'{line[:-1]}{added},"a field of the next release"]'


@pytest.mark.parametrize("newer", [False, True], ids=["as recorded", "plus a field"])
@pytest.mark.parametrize("path", STREAM_FILES, ids=lambda p: p.stem)
async def test_head_reads_the_previous_release_lines(
    path: Path,
    newer: bool,
    database_url: str,
    redis_url: str,
    channel_prefix: str,
    start_reader: StartReader,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream, commands = path.stem, _commands(path)
    await _restore_sequences(database_url)
    worker = await start_reader()
    handler = _reading(worker, stream)
    head_stream = handler.streams.get(stream)
    row_type = None if head_stream is None else head_stream.row_type
    lines = [_with_a_newer_field(line, row_type) if newer else line for line in _lines(path)]
    await _publish(redis_url, base_channel(channel_prefix) + CHANNELS[stream], lines)
    rows = sum(1 for cmd in commands if isinstance(cmd, RData))
    received = lambda: handler.metrics.value(  # noqa: E731
        "fanout_repl_commands_in_total", {"command": "RDATA", "stream": stream}
    )
    if head_stream is None:  # a stream HEAD no longer has: skipped, counted
        await _until(lambda: handler.metrics.value("fanout_repl_dropped_total", {"reason": "unknown_stream"})
                     == len(commands))  # fmt: skip
    elif await head_stream.max_token() is None:  # in the writer's memory: see the docstring
        await _until(lambda: received() == rows)
        assert handler.metrics.rejected == {}
        return
    else:
        last: dict[str, int] = {}
        for cmd in commands:
            token = cmd.new_token if isinstance(cmd, Position) else cmd.token
            if token is not None:
                last[cmd.instance] = max(last.get(cmd.instance, 0), token)

        def reached() -> bool:
            status = handler.stream_status(time.monotonic())[stream]
            return all(status[writer]["position"] >= token for writer, token in last.items())

        # The reader starts every writer at the sequence (set far ahead above), so its positions
        # may already be reached: wait for the lines themselves too.
        await _until(lambda: reached() and received() >= rows)
        assert received() == rows
    assert handler.metrics.rejected == {}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


def _reading(worker: Worker, stream: str) -> ReplicationHandler:
    """The replication handler of `worker` that applies `stream`'s rows (typing and presence have
    their own client); the main one when none does (a stream HEAD does not know)."""
    handlers = [worker.replication.handler] if worker.replication is not None else []
    if worker.ephemeral is not None and worker.ephemeral.client is not None:
        handlers.append(worker.ephemeral.client.handler)
    for handler in handlers:
        found = handler.streams.get(stream)
        if found is not None and found.writers:
            return handler
    return handlers[0]


async def _until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the recorded lines were not all taken in time"
        await asyncio.sleep(0.05)


async def test_head_skips_a_stream_it_does_not_know(
    redis_url: str, channel_prefix: str, start_reader: StartReader
) -> None:
    """The recorded events lines as the next release's new stream would come: skipped, counted."""
    lines = [
        line.replace(" events ", " a_stream_of_the_next_release ", 1)
        for line in _lines(COMPAT / "wire" / "streams" / "events.lines")
    ]
    handler = (await start_reader()).replication.handler
    await _publish(redis_url, base_channel(channel_prefix), lines)
    skipped = lambda: handler.metrics.value("fanout_repl_dropped_total", {"reason": "unknown_stream"})  # noqa: E731
    await _until(lambda: skipped() == len(lines))
    assert handler.metrics.rejected == {}


async def test_head_takes_the_previous_release_cluster_commands(
    redis_url: str, channel_prefix: str, start_reader: StartReader
) -> None:
    lines = _lines(COMPAT / "wire" / "cluster.lines")
    handler = (await start_reader()).replication.handler
    heard = lambda: sum(  # noqa: E731
        handler.metrics.value("fanout_repl_commands_in_total", {"command": name, "stream": ""})
        for name in ("REPLICATE", "USER_SYNC", "CLEAR_USER_SYNC")
    )
    before = heard()
    await _publish(redis_url, base_channel(channel_prefix), lines)
    await _until(lambda: heard() - before >= len(lines))
    assert handler.metrics.rejected == {}


def test_sync_streams_are_only_appended() -> None:
    """A token's components are positional: the previous release's order must be HEAD's prefix."""
    recorded = tuple(RECORDED["sync_streams"])
    assert SYNC_STREAMS[: len(recorded)] == recorded


async def test_head_answers_sync_for_every_previous_release_token(
    database_url: str, start_reader: StartReader
) -> None:
    """Each recorded `next_batch`, on a HEAD worker whose database knows the recorded instance ids
    (it writes everything itself, as after a restore onto a new deployment): 200, and the
    components the previous release wrote read back as it wrote them (those it had not at s0)."""
    names = {int(i): name for i, name in RECORDED["instance_map"].items()}
    conn = await asyncpg.connect(database_url)
    try:
        await conn.executemany(
            "INSERT INTO instance_map (instance_id, instance_name) VALUES ($1, $2)", list(names.items())
        )
        await conn.execute(
            "SELECT setval(pg_get_serial_sequence('instance_map', 'instance_id'), max(instance_id))"
            " FROM instance_map"
        )
    finally:
        await conn.close()
    ids = {name: i for i, name in names.items()}
    worker = await start_reader({"events": ["head_reader"]})
    async with aiohttp.ClientSession() as session:
        client = ClusterClient(session, {"head": f"http://127.0.0.1:{worker.http_port}"})
        await client.register("carol")
        for recorded in RECORDED["tokens"]:
            text = recorded["next_batch"]
            parsed = SyncToken.parse(text, SYNC_STREAMS, names)
            parts = text.split("_")
            assert [parsed.get(s).to_string(ids) for s in SYNC_STREAMS[: len(parts)]] == parts
            assert all(parsed.get(s).stream == 0 for s in SYNC_STREAMS[len(parts) :])
            body = await client.sync(since=text)
            SyncToken.parse_ids(body["next_batch"], SYNC_STREAMS)
