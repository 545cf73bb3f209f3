"""How a line's token is shown to be within the stream's sequence, driven line by line without
Redis. A stream's witness (`Stream.witness`): a row it finds stored at its token proves the token,
with no sequence read; a row it does not find (a forged line naming a stored row at another
token), a witness that declines and one whose read fails all leave the token to the sequence,
which still refuses what lies beyond it. A positions-only stream reads the sequence on the shared
clock's tick, once for every position heard meanwhile."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import pytest

from pubsub.handler import ReplicationHandler
from pubsub.metrics import ReplicationMetrics
from pubsub.streams import Stream, StreamRegistry
from pubsub.ticks import TICK_S, next_run
from tests.pubsub.conftest import wait_for
from workers.harness.memory import MemoryGenerator


class Line(NamedTuple):
    payload: str


class Sequence_(MemoryGenerator):
    """A generator whose sequence is at `top`, counting the reads of it."""

    def __init__(self, writers: Sequence[str], top: int) -> None:
        super().__init__(writers)
        self.top, self.reads = top, 0

    async def get_max_allocated_token(self) -> int:
        self.reads += 1
        return self.top


class Stored:
    """What the witness finds: (writer, token) -> payload; `mode` makes it decline or fail."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], str] = {}
        self.mode = "read"
        self.calls = 0

    def __call__(self, writer: str, rows: Sequence[tuple[int, Any]]) -> Awaitable[bool] | None:
        if self.mode == "decline":
            return None
        return self._found(writer, rows)

    async def _found(self, writer: str, rows: Sequence[tuple[int, Any]]) -> bool:
        self.calls += 1
        if self.mode == "fail":
            raise ConnectionError("database unreachable")
        token, row = rows[-1]
        return self.rows.get((writer, token)) == row.payload


class Harness:
    def __init__(self, handler: ReplicationHandler, sequence: Sequence_, stored: Stored) -> None:
        self.handler, self.sequence, self.stored = handler, sequence, stored
        self.applied: list[tuple[str, int, str]] = []

    async def send(self, *lines: str) -> None:
        self.handler.handle_lines([line.encode() for line in lines], 0.0)
        for _ in range(50):
            await asyncio.sleep(0)

    def counted(self, metric: str, labels: dict[str, str]) -> float:
        return self.handler.metrics.value(metric, labels)


def rdata(token: int, payload: str, prev: int) -> str:
    return f"RDATA s w1 {token} {json.dumps([prev, 1, payload])}"


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    handlers: list[ReplicationHandler] = []

    async def build(top: int, positions_only: bool = False) -> Harness:
        sequence, stored = Sequence_(["w1"], top), Stored()

        async def nothing(_writer: str, _low: int, _high: int, _limit: int) -> list[tuple[int, Any]]:
            return []

        stream = Stream("s", Line, nothing, sequence, ["w1", "w2"])
        stream.witness = stored
        h: Harness

        async def apply(_s: Stream[Any], writer: str, _token: int, rows: Sequence[tuple[int, Any]]) -> None:
            h.applied.extend((writer, t, row.payload) for t, row in rows)

        handler = ReplicationHandler(
            "me", StreamRegistry([stream]), apply, metrics=ReplicationMetrics(),
            positions_only=["s"] if positions_only else [],
        )  # fmt: skip
        handler.start()
        handlers.append(handler)
        h = Harness(handler, sequence, stored)
        await h.send("POSITION s w1 0 0")
        return h

    yield build
    for handler in handlers:
        await handler.stop()


async def test_a_row_found_stored_proves_its_token_without_a_sequence_read(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make(100)
    h.stored.rows[("w1", 5)] = "five"
    await h.send(rdata(5, "five", 0))
    assert h.applied == [("w1", 5, "five")]
    assert h.sequence.reads == 0 and h.stored.calls == 1
    assert h.counted("fanout_repl_witnessed_total", {"stream": "s"}) == 1
    await h.send("POSITION s w1 5 5")  # at or below what the row proved: no read either
    assert h.sequence.reads == 0


async def test_a_row_not_found_at_its_token_is_left_to_the_sequence(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make(100)
    h.stored.rows[("w1", 3)] = "real"
    await h.send(rdata(500, "real", 0))  # a stored row, named at a token beyond the sequence
    assert h.applied == [] and h.sequence.reads == 1
    assert h.counted("fanout_repl_rejected_total", {"reason": "beyond_sequence"}) == 1
    h.sequence.top = 200
    await h.send("POSITION s w1 0 0", rdata(150, "unseen", 0))  # not stored, within the sequence
    assert h.applied == [("w1", 150, "unseen")] and h.sequence.reads == 2 and h.stored.calls == 2
    await h.send(rdata(160, "under", 150))  # under the bound the last read left: no read at all
    assert h.applied[-1] == ("w1", 160, "under") and h.sequence.reads == 2 and h.stored.calls == 2
    assert h.counted("fanout_repl_witnessed_total", {"stream": "s"}) == 0


@pytest.mark.parametrize("mode", ["decline", "fail"])
async def test_a_witness_that_declines_or_fails_leaves_it_to_the_sequence(
    make: Callable[..., Awaitable[Harness]], mode: str
) -> None:
    h = await make(100)
    h.stored.rows[("w1", 5)] = "five"
    h.stored.mode = mode
    await h.send(rdata(5, "five", 0))
    assert h.applied == [("w1", 5, "five")] and h.sequence.reads == 1
    assert h.stored.calls == (0 if mode == "decline" else 1)
    await h.send(rdata(900, "far", 5))
    assert h.applied == [("w1", 5, "five")]
    assert h.counted("fanout_repl_rejected_total", {"reason": "beyond_sequence"}) == 1


async def test_a_positions_only_stream_reads_the_sequence_once_a_tick(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """Positions heard within a second wait for the next tick and share one read; a position still
    beyond the sequence then is refused as on a full reader."""
    h = await make(100, positions_only=True)
    loop = asyncio.get_running_loop()
    tick = next_run(loop.time(), TICK_S)
    h.handler.handle_lines([b"POSITION s w1 0 10", b"POSITION s w2 0 20", b"POSITION s w1 10 30"], 0.0)
    await asyncio.sleep(0.01)
    stream = h.handler.streams["s"]
    if loop.time() < tick - 0.05:  # well before the tick: nothing read, nothing moved yet
        assert h.sequence.reads == 0 and stream.current_token("w1") == 0
    await wait_for(lambda: stream.current_token("w1") == 30, limit_s=3, what="the tick's read")
    assert stream.current_token("w2") == 20 and h.sequence.reads == 1 and loop.time() >= tick
    h.handler.handle_lines([b"POSITION s w2 20 500"], 0.0)
    await wait_for(
        lambda: h.counted("fanout_repl_rejected_total", {"reason": "beyond_sequence"}) == 1, limit_s=3
    )
    assert stream.current_token("w2") == 20 and h.sequence.reads == 2
