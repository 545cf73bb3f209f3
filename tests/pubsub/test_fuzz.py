"""Generated wire lines through the real reader, not only the parser: nothing crashes it, nothing a
line may not do moves a position, and it keeps delivering afterwards.

Lines are built from the grammar with every field drawn from good and bad values (configured and
unknown writers, our own name, huge and malformed tokens, rows that do and do not fit the row
type), plus raw bytes. The property: every position the reader holds is 0 or a token that a
well-formed line from a configured writer other than itself announced."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubsub.handler import ReplicationHandler
from pubsub.metrics import ReplicationMetrics
from pubsub.streams import Stream, StreamRegistry
from pubsub.wire import MAX_TOKEN
from tests.pubsub.conftest import STREAM, NodeFactory, check_history, publish_raw, wait_for
from tests.pubsub.fakes import MemoryTable, Row, memory_stream

WRITERS = ["w1", "w2", "me"]
writers = st.sampled_from(["w1", "w2", "me", "intruder", "w1 ", "w\u00e9", ""])
streams = st.sampled_from(["s", "elsewhere", "nosuch", "s/x", ""])
tokens = st.one_of(
    st.integers(min_value=0, max_value=50).map(str),
    st.sampled_from(["batch", "-1", "01", "1.0", str(MAX_TOKEN), str(MAX_TOKEN + 1), "9" * 25, "\u0662", ""]),
)
payloads = st.one_of(
    st.builds(
        lambda p, n, v: json.dumps([p, n, v, 0]), st.integers(-2, 60), st.integers(-1, 3), st.text(max_size=8)
    ),
    st.builds(lambda v: json.dumps([v, 0]), st.text(max_size=8)),
    st.sampled_from(['[1,1,"x"]', '[1,1,"x",0,9]', '{"a": 1}', "[", "not json", '[1,1,"a\\u0000",0]', ""]),
)


@st.composite
def well_formed(draw: st.DrawFn) -> bytes:
    """A line the grammar accepts on stream "s", from any name: what a forger sends."""
    writer = draw(st.sampled_from(["w1", "w2", "me", "intruder"]))
    prev, new = sorted(draw(st.lists(st.integers(0, 60), min_size=2, max_size=2)))
    if draw(st.booleans()):
        return f"POSITION s {writer} {prev} {new}".encode()
    return f"RDATA s {writer} {new} {json.dumps([prev, 1, f'v{new}', 0])}".encode()


@st.composite
def any_line(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["RDATA", "POSITION", "REPLICATE", "USER_SYNC", "CLEAR_USER_SYNC", "raw"]))
    if kind == "raw":
        return draw(st.binary(max_size=60))
    if kind == "RDATA":
        text = f"RDATA {draw(streams)} {draw(writers)} {draw(tokens)} {draw(payloads)}"
    elif kind == "POSITION":
        text = f"POSITION {draw(streams)} {draw(writers)} {draw(tokens)} {draw(tokens)}"
    elif kind == "USER_SYNC":
        state = draw(st.sampled_from(["start", "end", "maybe"]))
        text = f"USER_SYNC {draw(writers)} @u:x dev {state} {draw(tokens)}"
    else:
        text = f"{kind} {draw(writers)}".rstrip() if draw(st.booleans()) else kind
    return text.encode() + draw(st.sampled_from([b"", b"", b"\n", b"\r", b" ", b"\xff"]))


lines = st.one_of(well_formed(), any_line())


def _announced(line: bytes) -> tuple[str, int] | None:
    """(writer, token) a well-formed line from another configured writer may move a position to."""
    try:
        text = line.decode()
    except UnicodeDecodeError:
        return None
    parts = text.split(" ")
    if len(parts) < 5 or parts[1] != "s" or parts[2] not in ("w1", "w2"):
        return None
    token = parts[3] if parts[0] == "RDATA" else parts[4] if parts[0] == "POSITION" else ""
    return (parts[2], int(token)) if token.isdigit() and token.isascii() else None


async def _no_apply(stream: Stream[Any], instance: str, token: int, rows: Sequence[tuple[int, Row]]) -> None:
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(lines, min_size=1, max_size=20), min_size=1, max_size=8))
async def test_no_generated_line_crashes_the_reader_or_moves_a_position_it_may_not(
    reads: list[list[bytes]],
) -> None:
    table = MemoryTable()
    for token in range(1, 61):
        table.add("w1", token, Row(payload=f"r{token}"))
    handler = ReplicationHandler(
        "me",
        StreamRegistry([memory_stream("s", WRITERS, table)]),
        _no_apply,
        metrics=ReplicationMetrics(),
        other_streams=["elsewhere"],
        max_line_bytes=200,
    )
    handler.start()
    try:
        allowed: dict[str, set[int]] = {"w1": {0}, "w2": {0}}
        for read in reads:
            handler.handle_lines(read, 0.0)
            for line in read:
                announced = _announced(line)
                if announced is not None:
                    allowed[announced[0]].add(announced[1])
            for _ in range(20):
                await asyncio.sleep(0)
        stream = handler.streams["s"]
        for writer, tokens_seen in allowed.items():
            assert stream.current_token(writer) in tokens_seen
        assert stream.current_token("me") == 0  # a line under our own name never moves us
        assert stream.current_token("intruder") == 0
        task = handler._states["s"].task
        assert task is not None and not task.done()  # the stream's consumer survived every line
    finally:
        await handler.stop()


async def test_generated_lines_on_the_channel_then_real_rows_are_delivered(
    make_node: NodeFactory, redis_url: str, channel_prefix: str
) -> None:
    reader = await make_node("r1", writers=["w1"], max_line_bytes=2048)
    writer = await make_node("w1", writers=["w1"])
    await writer.write(3)
    await wait_for(lambda: reader.applied_count() == 3, what="first rows")
    strategy = st.lists(lines, min_size=300, max_size=300)
    rng = random.Random(11)
    batch = [line.replace(b" s ", f" {STREAM} ".encode(), 1) for line in _sample(strategy, rng)]
    await publish_raw(redis_url, channel_prefix, batch)
    await writer.write(20)
    await wait_for(lambda: reader.applied_count() == 23, what="rows written after the generated lines")
    check_history(reader.applied, {"w1": writer.written})
    assert reader.metric("fanout_repl_rejected_total") > 0


def _sample(strategy: st.SearchStrategy[list[bytes]], rng: random.Random) -> list[bytes]:
    """One value of `strategy`, reproducibly, outside a `@given` test."""
    found: list[list[bytes]] = []

    @settings(max_examples=1, database=None, derandomize=True)
    @given(strategy)
    def take(value: list[bytes]) -> None:
        found.append(value)

    take()
    rng.shuffle(found[0])
    return found[0]
