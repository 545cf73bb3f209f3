"""`handle_lines` checks most RDATA inline, on the bytes; it must decide every line exactly as the
full per-line path (`handle_line`: `parse_line`, then routing) does. Two handlers get the same lines,
one through each entry point; what they queued and counted must be equal. Stream "t" is applied;
stream "s" is applied too, or followed for positions only."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub.handler import ReplicationHandler
from pubsub.metrics import ReplicationMetrics
from pubsub.streams import StreamRegistry
from tests.pubsub.fakes import MemoryTable, memory_stream


def _handler(max_line_bytes: int, positions_only: bool = False) -> ReplicationHandler:
    return ReplicationHandler(
        "me",
        StreamRegistry([memory_stream(name, ["w1", "w2", "me"], MemoryTable()) for name in ("s", "t")]),
        _no_apply,
        metrics=ReplicationMetrics(),
        other_streams=["elsewhere"],
        positions_only=["s"] if positions_only else [],
        max_line_bytes=max_line_bytes,
    )


async def _no_apply(*_: object) -> None:
    return None


def _state(handler: ReplicationHandler) -> tuple[object, ...]:
    m = handler.metrics
    queued = [[tuple(entry) for entry in handler._states[name].queue] for name in ("s", "t")]
    heard = [dict(handler._states[name].last_heard) for name in ("s", "t")]
    return (queued, heard, m.bytes_in, m.rejected, m.dropped, m.commands_in)


_GOOD = json.dumps([4, 1, "payload", 7], separators=(",", ":"))
_PAYLOADS = [
    _GOOD,
    json.dumps([4, 1, "payload", 7]),  # spaces after commas: still valid JSON
    " " + _GOOD,
    _GOOD + " ",
    '{"prev": 4, "n": 1, "row": ["payload", 7]}',
    '[4,1,"payload","7"]',
    '[4,1,"payload",7,8]',
    '[4,1,"pay\nload",7]',
    '[4,1,"payload",7]\r',
    '[4,1,"p\\u00e9",7]',
    '[4,1,"pé",7]',
    '[-1,1,"payload",7]',
    '[4,0,"payload",7]',
    '[4,1,"x",7',
    "not json",
    "",
]
_TOKENS = ["5", "0", "05", "batch", "-5", "+5", "5a", "\u0661", "9" * 19, "9" * 20, "", "5 "]
_WRITERS = ["w1", "w2", "me", "intruder", "w1 "]
_STREAMS = ["s", "t", "elsewhere", "nosuch", "s/x"]


@st.composite
def _line(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["RDATA", "POSITION", "RDATA", "RDATA", "REPLICATE", "rdata"]))
    stream, writer = draw(st.sampled_from(_STREAMS)), draw(st.sampled_from(_WRITERS))
    if kind == "POSITION":
        text = f"POSITION {stream} {writer} {draw(st.sampled_from(_TOKENS))} {draw(st.sampled_from(_TOKENS))}"
    elif kind == "REPLICATE":
        text = "REPLICATE"
    else:
        token, payload = draw(st.sampled_from(_TOKENS)), draw(st.sampled_from(_PAYLOADS))
        text = f"{kind} {stream} {writer} {token} {payload}"
    data = text.encode()
    if draw(st.integers(0, 9)) == 0:  # a byte that is not UTF-8, somewhere
        at = draw(st.integers(0, len(data)))
        data = data[:at] + b"\xff" + data[at:]
    return data


@settings(max_examples=400, deadline=None)
@given(
    lines=st.lists(_line(), max_size=12),
    max_line_bytes=st.sampled_from([1 << 20, 40]),
    positions_only=st.booleans(),
)
def test_handle_lines_decides_every_line_as_handle_line_does(
    lines: list[bytes], max_line_bytes: int, positions_only: bool
) -> None:
    together = _handler(max_line_bytes, positions_only)
    one_by_one = _handler(max_line_bytes, positions_only)
    together.handle_lines(lines, 1.0)
    for line in lines:
        one_by_one.handle_line(line, 1.0)
    assert _state(together) == _state(one_by_one)


def test_the_inline_path_is_taken_for_other_writers_rows() -> None:
    """The property above would hold trivially if everything fell back to `handle_line`."""
    handler = _handler(1 << 20)
    calls: list[bytes] = []
    handler.handle_line = lambda data, now: calls.append(data)  # type: ignore[method-assign]
    handler.handle_lines([f"RDATA s w1 5 {_GOOD}".encode(), b"RDATA s me 6 " + _GOOD.encode()], 1.0)
    assert calls == []
    assert len(handler._states["s"].queue) == 1
    assert handler.metrics.dropped == {("echo",): 1}


def test_a_positions_only_stream_takes_tokens_inline_and_queues_one_position_per_run() -> None:
    handler = _handler(1 << 20, positions_only=True)
    calls: list[bytes] = []
    handler.handle_line = lambda data, now: calls.append(data)  # type: ignore[method-assign]
    rows = [f"RDATA s w1 {token} {_GOOD}".encode() for token in (5, 7, 6)]
    handler.handle_lines([*rows, f"RDATA s w2 3 {_GOOD}".encode(), f"RDATA s w1 9 {_GOOD}".encode()], 1.0)
    assert calls == []
    queued = [(entry[1].instance, entry[1].new_token) for entry in handler._states["s"].queue]
    assert queued == [("w1", 7), ("w2", 3), ("w1", 9)]
    assert handler.metrics.commands_in == {("RDATA", "s"): 5}


def test_a_positions_only_run_is_queued_before_a_line_of_the_full_path() -> None:
    """Lines the full path handles (here another writer's POSITION) keep their place in the queue."""
    lines = [
        f"RDATA s w1 5 {_GOOD}".encode(),
        b"POSITION s w2 1 3",
        f"RDATA s w1 6 {_GOOD}".encode(),
    ]
    together, one_by_one = _handler(1 << 20, True), _handler(1 << 20, True)
    together.handle_lines(lines, 1.0)
    for line in lines:
        one_by_one.handle_line(line, 1.0)
    assert _state(together) == _state(one_by_one)
    assert [(e[1].instance, e[1].new_token) for e in together._states["s"].queue] == [
        ("w1", 5), ("w2", 3), ("w1", 6)
    ]  # fmt: skip


def test_a_line_that_is_not_utf8_is_rejected_on_a_positions_only_stream_too() -> None:
    """Found by the property above: no row validator reads the payload there, and `parse_line`
    rejects the whole line."""
    lines = [b'RDATA s w1 5 [\xff4,1,"payload",7]']
    together, one_by_one = _handler(1 << 20, True), _handler(1 << 20, True)
    together.handle_lines(lines, 1.0)
    one_by_one.handle_line(lines[0], 1.0)
    assert _state(together) == _state(one_by_one)
    assert together.metrics.rejected == {("not_utf8",): 1}
