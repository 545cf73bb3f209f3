"""What the publisher sends for staged rows: the lines `format_rdata` and `Stream.encode_payload`
define, whichever way the publisher builds them."""

from __future__ import annotations

import asyncio
import json
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub import keys
from pubsub.metrics import ReplicationMetrics
from pubsub.publisher import REPLICATE_COALESCE_S, StreamPublisher
from pubsub.redis_transport import RedisTransport
from pubsub.streams import Stream
from pubsub.wire import format_rdata
from tests.conftest import RedisTarget
from tests.pubsub.conftest import STREAM, Node, NodeFactory, wait_for
from tests.pubsub.fakes import MemoryGenerator, MemoryTable, Row, memory_stream


class _Recorder:
    """Stands in for the transport: keeps what would have been published."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    async def publish_many(self, messages: list[tuple[str, str]]) -> int:
        self.lines += messages
        return len(messages)

    async def write_keys(self, commands: object) -> None:
        """The periodic tick writes the hint keys; nothing to keep of them here."""


def _expected(name: str, prev: int, tokens: list[tuple[int, list[Row | str]]]) -> list[str]:
    lines, last = [], prev
    for token, rows in tokens:
        for row in rows[:-1]:
            lines.append(format_rdata(name, "me", None, Stream.encode_payload(row)))
        lines.append(format_rdata(name, "me", token, Stream.encode_payload(rows[-1], last, len(rows))))
        last = token
    return lines


_ROW = st.builds(Row, st.text(max_size=8), st.integers(-5, 5))
_ROWS = st.lists(st.one_of(_ROW, _ROW.map(Stream.encode_payload)), min_size=1, max_size=3)


@settings(max_examples=50, deadline=None)
@given(rows_per_token=st.lists(_ROWS, min_size=1, max_size=6), start=st.integers(0, 100))
async def test_flushed_lines_are_the_wire_format(rows_per_token: list[list[Row | str]], start: int) -> None:
    stream = memory_stream("s", ["me"], MemoryTable())
    generator = cast(MemoryGenerator, stream.generator)
    generator.positions["me"] = start
    recorder = _Recorder()
    publisher = StreamPublisher(
        "me", [stream], cast(RedisTransport, recorder), metrics=ReplicationMetrics(), prefix="p",
        per_stream_channels=False, announce_interval_s=1.0, heartbeat_ttl_s=5.0,
    )  # fmt: skip
    publisher.start()
    try:
        tokens = [(start + 1 + i, rows) for i, rows in enumerate(rows_per_token)]
        for token, rows in reversed(tokens):  # staging order does not matter, token order does
            publisher.stage_rows("s", [(token, row) for row in rows])
        generator.positions["me"] = tokens[-1][0]
        await publisher.flush()
    finally:
        await publisher.stop()
    sent = [line for _, line in recorder.lines if line.startswith("RDATA")]
    assert sent == _expected("s", start, tokens)


async def test_a_burst_of_replicate_gets_one_answer_per_interval() -> None:
    """300 REPLICATEs over about 0.3 s (every worker of a big cluster restarting at once, or a
    flood): a handful of POSITIONs, not one per REPLICATE."""
    stream = memory_stream("s", ["me"], MemoryTable())
    recorder = _Recorder()
    publisher = StreamPublisher(
        "me", [stream], cast(RedisTransport, recorder), metrics=ReplicationMetrics(), prefix="p",
        per_stream_channels=False, announce_interval_s=60.0, heartbeat_ttl_s=5.0,
    )  # fmt: skip
    publisher.start()
    try:
        await asyncio.sleep(0.05)  # the first announcement, at start
        before = sum(1 for _, line in recorder.lines if line.startswith("POSITION"))
        for _ in range(300):
            publisher.request_announce_all()
            await asyncio.sleep(0.001)
        await asyncio.sleep(2 * REPLICATE_COALESCE_S)
        answers = sum(1 for _, line in recorder.lines if line.startswith("POSITION")) - before
    finally:
        await publisher.stop()
    assert 1 <= answers <= 10, answers  # the burst lasts ~0.3-0.6 s: a few intervals of 0.1 s


def _positions_out(node: Node) -> float:
    return node.metric("fanout_repl_commands_out_total", command="POSITION", stream=STREAM)


async def test_an_idle_stream_owes_a_position_only_after_rows_or_a_move(make_node: NodeFactory) -> None:
    """With ticks driven by hand (the loop's own are a minute apart): a tick repeats nothing while
    nothing moved, sends one POSITION after rows (so a reader that lost the last RDATA hears of it
    within one tick), and announces an idle writer's position that other writers moved, which is
    what lets readers' linear position pass it."""
    reader = await make_node("r1", writers=["w1", "w2"], announce_interval_s=60)
    w1 = await make_node("w1", writers=["w1", "w2"], announce_interval_s=60)
    w2 = await make_node("w2", writers=["w1", "w2"], announce_interval_s=60)
    await wait_for(lambda: all(reader.client.handler.is_connected(STREAM, w) for w in ("w1", "w2")))
    await asyncio.sleep(3 * REPLICATE_COALESCE_S)  # the answers to the start's REPLICATEs are out
    await w1.client.publisher.flush(keepalive=True)  # whatever the start owed
    before = _positions_out(w1)
    await w1.client.publisher.flush(keepalive=True)
    assert _positions_out(w1) == before
    await w1.write(3)
    await wait_for(lambda: reader.applied_count() == 3, what="rows")
    sent = _positions_out(w1)
    await w1.client.publisher.flush(keepalive=True)
    assert _positions_out(w1) == sent + 1
    await w1.client.publisher.flush(keepalive=True)
    assert _positions_out(w1) == sent + 1

    top = w1.generator.get_current_token_for_writer("w1")
    await wait_for(lambda: w2.generator.get_current_token_for_writer("w2") >= top, what="w2 follows w1")
    assert reader.generator.get_current_token() < top  # held at the idle w2 until it speaks
    await w2.client.publisher.flush(keepalive=True)
    await wait_for(lambda: reader.generator.get_current_token() >= top, what="the reader passes idle w2")


async def test_an_idle_writer_keeps_announcing_at_the_keepalive_cadence(
    make_node: NodeFactory, redis_target: RedisTarget, channel_prefix: str
) -> None:
    """Nothing written: POSITIONs still come (every third tick here), so readers keep hearing the
    writer, and the heartbeat key stays."""
    settings = {"announce_interval_s": 0.05, "silent_writer_intervals": 6}
    reader = await make_node("r1", **settings)
    writer = await make_node("w1", **settings)
    await wait_for(lambda: reader.client.handler.is_connected(STREAM, "w1"), what="connected")
    start = _positions_out(writer)
    await wait_for(lambda: _positions_out(writer) >= start + 3, what="three keep-alives")
    raw = redis_target.client()
    try:
        assert await raw.pttl(keys.heartbeat_key(channel_prefix, "w1")) > 0
    finally:
        await raw.aclose()


@pytest.mark.parametrize("publish_replies", [False, True], ids=["quiet link", "replies read"])
async def test_a_tick_writes_the_hint_keys_on_either_link(
    make_node: NodeFactory, redis_target: RedisTarget, channel_prefix: str, publish_replies: bool
) -> None:
    """The positions hash holds the writer's position and the heartbeat key names its streams,
    with a TTL, whether the writer's publishes ask for no replies or read them."""
    writer = await make_node("w1", announce_interval_s=0.05, publish_replies=publish_replies)
    transport = writer.client.transport
    assert isinstance(transport, RedisTransport)
    assert (transport._quiet is None) == publish_replies
    await writer.write(3)
    top = writer.generator.get_current_token_for_writer("w1")
    raw = redis_target.client()
    try:
        hinted = None
        for _ in range(100):
            hinted = await raw.hget(keys.positions_key(channel_prefix, STREAM), "w1")
            if hinted is not None and int(hinted) >= top:
                break
            await asyncio.sleep(0.05)
        assert hinted is not None and int(hinted) == top
        beat = await raw.get(keys.heartbeat_key(channel_prefix, "w1"))
        assert beat is not None and STREAM in json.loads(beat)["streams"]
        assert await raw.pttl(keys.heartbeat_key(channel_prefix, "w1")) > 0
    finally:
        await raw.aclose()
