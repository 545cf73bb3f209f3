"""Real faults: the Redis server killed and restarted, the subscriber's connection killed by the server."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.pubsub.conftest import STREAM, NodeFactory, check_history, fault_mid_stream, wait_for
from workers.embedded.services import RunningServer, _redis_answers, redis_server_bin, start_redis


def _start_on_port(port: int, data_dir: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [str(redis_server_bin("embedded")), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(data_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    return process


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RunningServer]:
    server = start_redis(tmp_path / "r")
    try:
        yield server
    finally:
        server.stop()


async def test_redis_killed_and_restarted_mid_stream_loses_nothing(
    make_node: NodeFactory, private_redis: RunningServer, tmp_path: Path
) -> None:
    url = private_redis.url
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    reader = await make_node("r1", url=url, announce_interval_s=0.1)
    writer = await make_node("w1", url=url, announce_interval_s=0.1)
    restarted: list[subprocess.Popen[bytes]] = []

    async def kill_then_restart() -> None:
        private_redis.process.send_signal(signal.SIGKILL)
        private_redis.process.wait()
        written_while_down = len(writer.written)
        await wait_for(
            lambda: len(writer.written) >= written_while_down + 20, what="writes while Redis is down"
        )
        restarted.append(_start_on_port(port, tmp_path))
        await wait_for(lambda: _redis_answers(port), what="restarted Redis")
        await wait_for(lambda: reader.client.transport.connects >= 2, what="reader re-subscribed")

    try:
        await fault_mid_stream(reader, writer, kill_then_restart)
        assert reader.metric("fanout_repl_catch_up_rows_total", stream=STREAM) > 0
        await reader.client.stop()
        await writer.client.stop()
    finally:
        for process in restarted:
            process.kill()
            process.wait()


async def test_server_killing_the_subscriber_connection_triggers_resync(
    make_node: NodeFactory, private_redis: RunningServer
) -> None:
    url = private_redis.url
    reader = await make_node("r1", url=url)
    writer = await make_node("w1", url=url)
    raw = aioredis.Redis.from_url(url)
    try:
        await writer.write(5)
        await wait_for(lambda: reader.applied_count() == 5, what="first rows")
        for _ in range(3):
            await raw.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            await writer.write(5)
        await wait_for(lambda: reader.applied_count() == len(writer.written), what="every row after kills")
    finally:
        await raw.aclose()
    check_history(reader.applied, {"w1": writer.written})
    reconnects = reader.metric("fanout_repl_reconnects_total", kind="subscribed")
    assert reconnects >= 1


async def test_subscriber_cut_off_by_the_output_buffer_limit_catches_up(
    make_node: NodeFactory, private_redis: RunningServer
) -> None:
    """The GUIDE's pitfall: Redis disconnects a subscriber that fell behind; the catch-up saves it.

    The reader stops reading its socket (its event loop runs on, so the writer in this process keeps
    publishing) until Redis has cut it off, then reads again: it finds the connection gone,
    reconnects and catches up from the database.
    """
    url = private_redis.url
    raw = aioredis.Redis.from_url(url)
    await raw.config_set("client-output-buffer-limit", "pubsub 256kb 128kb 1")
    reader = await make_node("r1", url=url)
    writer = await make_node("w1", url=url)
    pubsub = reader.client.transport._pubsub
    assert pubsub is not None and pubsub.connection is not None
    parser = pubsub.connection._parser
    read_from_socket = parser.read_from_socket
    reading = asyncio.Event()

    async def stalled_read() -> Any:
        await reading.wait()
        return await read_from_socket()

    parser.read_from_socket = stalled_read

    async def cut_off() -> int:
        return int((await raw.info("stats"))["client_output_buffer_limit_disconnections"])

    try:
        written = 0
        while await cut_off() == 0:
            assert written < 30_000, "Redis never cut the stalled subscriber off"
            await writer.write_many(1000, pad=2000)
            written += 1000
            await asyncio.sleep(0.05)
        reading.set()
        await wait_for(lambda: reader.applied_count() == len(writer.written), limit_s=30, what="every row")
    finally:
        reading.set()
        await raw.aclose()
    check_history(reader.applied, {"w1": writer.written})
    assert reader.metric("fanout_repl_reconnects_total") >= 1
    assert reader.metric("fanout_repl_catch_up_rows_total", stream=STREAM) > 0
