"""A row that depends on another writer's token (`Stream.dependency_field`), driven line by line
without Redis: the other writer is brought up to the token from the database before the row is
applied, live or caught up; once, and not at all when already covered; never past a token the
stream cannot show; and the row waits (it is not applied) while the dependency cannot be met.
`check_dependencies` is the order checker these tests use, shown to catch a broken history."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, NamedTuple

import pytest

from pubsub.handler import ReplicationHandler
from pubsub.metrics import ReplicationMetrics
from pubsub.streams import Stream, StreamRegistry
from workers.harness.memory import MemoryGenerator


class DepRow(NamedTuple):
    payload: str
    after: tuple[tuple[str, int], ...] | None = None


def dep(payload: str, after: tuple[str, int] | None = None) -> DepRow:
    return DepRow(payload, None if after is None else (after,))


class BoundedGenerator(MemoryGenerator):
    """A generator whose sequence is at `top` (as `MultiWriterIdGenerator` reads it)."""

    top = 1000

    async def get_max_allocated_token(self) -> int:
        return self.top


class Table:
    """Each writer's committed rows; `down` makes every read fail (the database unreachable)."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[int, DepRow]]] = {}
        self.calls: list[tuple[str, int, int]] = []
        self.down = False

    def add(self, writer: str, token: int, payload: str, after: tuple[str, int] | None = None) -> None:
        self.rows.setdefault(writer, []).append((token, dep(payload, after)))

    async def update(self, writer: str, low: int, high: int, limit: int) -> list[tuple[int, DepRow]]:
        self.calls.append((writer, low, high))
        if self.down:
            raise ConnectionError("database unreachable")
        return sorted(r for r in self.rows.get(writer, []) if low < r[0] <= high)[:limit]


def rd(writer: str, token: int, payload: str, prev: int, after: tuple[str, int] | None = None) -> str:
    fields: list[Any] = [prev, 1, payload] + ([[list(after)]] if after is not None else [])
    return f"RDATA s {writer} {token} {json.dumps(fields)}"


#: (writer, token, row) in the order they were applied.
Applied = list[tuple[str, int, DepRow]]


def check_dependencies(applied: Applied, committed: dict[str, list[tuple[int, DepRow]]]) -> None:
    """Every applied row that depends on (writer, token) was applied after every committed row of
    that writer at or below the token; no row applied twice. Raises AssertionError."""
    seen: set[tuple[str, int, str]] = set()
    for writer, token, row in applied:
        key = (writer, token, row.payload)
        assert key not in seen, f"{key} applied twice"
        seen.add(key)
        for other, upto in row.after or ():
            rows = committed.get(other, [])
            missing = [t for t, r in rows if t <= upto and (other, t, r.payload) not in seen]
            assert not missing, f"{writer}@{token} applied before {other}'s rows {missing}"


class Harness:
    def __init__(self, handler: ReplicationHandler, table: Table, applied: Applied) -> None:
        self.handler, self.table, self.applied = handler, table, applied

    async def send(self, *lines: str) -> None:
        self.handler.handle_lines([line.encode() for line in lines], 0.0)
        for _ in range(50):
            await asyncio.sleep(0)

    def tokens(self) -> list[tuple[str, int]]:
        return [(w, t) for w, t, _ in self.applied]

    def position(self, writer: str) -> int:
        return self.handler.streams["s"].current_token(writer)

    def counted(self, metric: str, labels: dict[str, str]) -> float:
        return self.handler.metrics.value(metric, labels)


@pytest.fixture
async def make() -> AsyncIterator[Callable[[], Harness]]:
    handlers: list[ReplicationHandler] = []

    def build() -> Harness:
        table = Table()
        applied: Applied = []
        stream = Stream(
            "s", DepRow, table.update, BoundedGenerator(["w1", "w2"]), ["w1", "w2"], dependency_field="after"
        )

        async def apply(_s: Stream[Any], writer: str, _token: int, rows: Sequence[tuple[int, Any]]) -> None:
            applied.extend((writer, t, row) for t, row in rows)

        handler = ReplicationHandler("me", StreamRegistry([stream]), apply, metrics=ReplicationMetrics())
        handler.start()
        handlers.append(handler)
        return Harness(handler, table, applied)

    yield build
    for handler in handlers:
        await handler.stop()


async def connected(h: Harness) -> Harness:
    await h.send("POSITION s w1 0 0", "POSITION s w2 0 0")
    return h


async def test_a_live_row_waits_for_the_rows_it_depends_on_fetched_from_the_database(
    make: Callable[[], Harness],
) -> None:
    h = await connected(make())
    for token in (1, 2, 3):  # committed by w1, never published (it died)
        h.table.add("w1", token, f"old{token}")
    h.table.add("w2", 10, "new", after=("w1", 3))
    await h.send(rd("w2", 10, "new", prev=0, after=("w1", 3)))
    assert h.tokens() == [("w1", 1), ("w1", 2), ("w1", 3), ("w2", 10)]
    assert h.position("w1") == 3
    assert h.counted("fanout_repl_dependency_catch_ups_total", {"stream": "s"}) == 1
    check_dependencies(h.applied, h.table.rows)


async def test_after_a_loss_the_caught_up_row_brings_its_dependency_first(
    make: Callable[[], Harness],
) -> None:
    h = await connected(make())
    h.table.add("w1", 2, "old")
    h.table.add("w2", 5, "first", after=("w1", 2))
    h.table.add("w2", 6, "second", after=("w1", 2))
    await h.send("POSITION s w2 6 6")  # its RDATA were lost: it catches up from the database
    assert h.tokens() == [("w1", 2), ("w2", 5), ("w2", 6)]
    assert [c[0] for c in h.table.calls] == ["w2", "w1"]  # once for w1: the second row is covered
    check_dependencies(h.applied, h.table.rows)


async def test_a_duplicate_and_the_old_writers_late_rows_are_applied_once(
    make: Callable[[], Harness],
) -> None:
    h = await connected(make())
    h.table.add("w1", 1, "old")
    h.table.add("w2", 4, "new", after=("w1", 1))
    line = rd("w2", 4, "new", prev=0, after=("w1", 1))
    await h.send(line, line)
    await h.send(rd("w1", 1, "old", prev=0))  # the old writer's row, published at last
    assert h.tokens() == [("w1", 1), ("w2", 4)]
    assert len(h.table.calls) == 1
    check_dependencies(h.applied, h.table.rows)


async def test_a_covered_dependency_costs_no_query(make: Callable[[], Harness]) -> None:
    h = await connected(make())
    await h.send(rd("w1", 1, "old", prev=0), rd("w2", 4, "new", prev=0, after=("w1", 1)))
    assert h.tokens() == [("w1", 1), ("w2", 4)]
    assert h.table.calls == []
    assert h.counted("fanout_repl_dependency_catch_ups_total", {"stream": "s"}) == 0


async def test_a_dependency_with_no_rows_left_moves_the_position_to_the_token(
    make: Callable[[], Harness],
) -> None:
    """The old writer's last IDs were gaps (a rolled-back batch): its position still reaches the
    named token, which the writer of the row guarantees is final."""
    h = await connected(make())
    await h.send(rd("w2", 9, "new", prev=0, after=("w1", 7)))
    assert h.tokens() == [("w2", 9)]
    assert h.position("w1") == 7


async def test_the_row_is_held_while_its_dependency_cannot_be_fetched(make: Callable[[], Harness]) -> None:
    h = await connected(make())
    h.table.add("w1", 1, "old")
    h.table.add("w2", 4, "new", after=("w1", 1))
    h.table.down = True
    await h.send(rd("w2", 4, "new", prev=0, after=("w1", 1)))
    assert h.applied == [] and h.position("w2") == 0  # held: neither applied nor skipped
    h.table.down = False
    await h.send(rd("w2", 5, "later", prev=4))  # still waiting for w2's POSITION: dropped
    assert h.applied == []
    h.table.add("w2", 5, "later")
    await h.send("POSITION s w2 5 5")
    assert h.tokens() == [("w1", 1), ("w2", 4), ("w2", 5)]
    check_dependencies(h.applied, h.table.rows)


async def test_a_dependency_beyond_the_sequence_is_refused(make: Callable[[], Harness]) -> None:
    h = await connected(make())
    await h.send(rd("w2", 4, "new", prev=0, after=("w1", BoundedGenerator.top + 1)))
    assert h.applied == [] and h.position("w1") == 0
    assert h.counted("fanout_repl_rejected_total", {"reason": "beyond_sequence"}) == 1


async def test_a_dependency_on_a_writer_the_stream_does_not_have_is_skipped(
    make: Callable[[], Harness],
) -> None:
    h = await connected(make())
    await h.send(rd("w2", 4, "new", prev=0, after=("w9", 3)))
    assert h.tokens() == [("w2", 4)]
    assert h.counted("fanout_repl_dropped_total", {"reason": "dependency_unknown_writer"}) == 1


def test_the_checker_finds_a_row_applied_before_its_dependency() -> None:
    committed = {"w1": [(1, DepRow("old"))], "w2": [(4, dep("new", ("w1", 1)))]}
    with pytest.raises(AssertionError, match="applied before w1's rows"):
        check_dependencies([("w2", 4, dep("new", ("w1", 1))), ("w1", 1, DepRow("old"))], committed)
    with pytest.raises(AssertionError, match="applied twice"):
        check_dependencies([("w1", 1, DepRow("old")), ("w1", 1, DepRow("old"))], committed)
    check_dependencies([("w1", 1, DepRow("old")), ("w2", 4, dep("new", ("w1", 1)))], committed)
