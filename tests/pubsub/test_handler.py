"""Reader-side rules, driven line by line without Redis (the integration tests add Redis and Postgres)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from pubsub.handler import ReplicationHandler
from pubsub.metrics import ReplicationMetrics
from pubsub.streams import Stream, StreamRegistry
from tests.pubsub.fakes import MemoryTable, Row, memory_stream

Applied = list[tuple[str, int, list[str]]]


def rd(writer: str, token: int | None, payload: object, prev: int = 0, n: int = 1, stream: str = "s") -> str:
    """An RDATA line as the publisher writes it: a `Row` as an array, after `prev` and `n` on
    numbered rows."""
    if token is None:
        return f"RDATA {stream} {writer} batch {json.dumps([payload, 0])}"
    return f"RDATA {stream} {writer} {token} {json.dumps([prev, n, payload, 0])}"


class Harness:
    def __init__(self, handler: ReplicationHandler, table: MemoryTable, applied: Applied, events: list[str]):
        self.handler = handler
        self.table = table
        self.applied = applied
        self.events = events

    def send(self, *lines: str) -> None:
        """Deliver `lines` as one socket read would (the path the transport takes)."""
        self.handler.handle_lines([line.encode() for line in lines], 0.0)

    async def settle(self) -> None:
        for _ in range(50):
            await asyncio.sleep(0)

    def rejected(self, reason: str) -> float:
        return self.handler.metrics.value("fanout_repl_rejected_total", {"reason": reason})

    def dropped(self, reason: str) -> float:
        return self.handler.metrics.value("fanout_repl_dropped_total", {"reason": reason})

    def position(self, writer: str) -> int:
        return self.handler.streams["s"].current_token(writer)


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., Harness]]:
    handlers: list[ReplicationHandler] = []

    def build(
        queue_size: int = 100,
        batch: int = 3,
        fail_on: Callable[[int], bool] | None = None,
        positions_only: bool = False,
    ) -> Harness:
        table = MemoryTable()
        applied: Applied = []
        events: list[str] = []
        stream = memory_stream("s", ["w1", "w2"], table)

        async def apply(
            stream: Stream[Any], instance: str, token: int, rows: Sequence[tuple[int, Row]]
        ) -> None:
            if fail_on is not None and fail_on(token):
                raise RuntimeError("application failed")
            events.append(f"apply {token} pos={stream.current_token(instance)}")
            applied.append((instance, token, [r.payload for _, r in rows if isinstance(r, Row)]))

        handler = ReplicationHandler(
            "me",
            StreamRegistry([stream]),
            apply,
            metrics=ReplicationMetrics(),
            other_streams=["elsewhere"],
            positions_only=["s"] if positions_only else [],
            catch_up_batch_size=batch,
            queue_size=queue_size,
        )
        handler.position_listeners.append(
            lambda s, w, t: events.append(f"listener {t} pos={handler.streams[s].current_token(w)}")
        )
        handler.start()
        handlers.append(handler)
        return Harness(handler, table, applied, events)

    yield build
    for handler in handlers:
        await handler.stop()


async def test_rdata_is_dropped_until_the_first_position(make: Callable[..., Harness]) -> None:
    h = make()
    h.table.add("w1", 1, Row(payload="a"))
    h.send(rd("w1", 1, "a"))
    await h.settle()
    assert h.applied == []
    assert h.dropped("not_connected") == 1
    h.send("POSITION s w1 1 1")
    await h.settle()
    assert h.applied == [("w1", 1, ["a"])]  # the catch-up brought it
    h.send(rd("w1", 2, "b", prev=1))
    await h.settle()
    assert h.applied[-1] == ("w1", 2, ["b"])


async def test_batches_apply_together_and_duplicates_are_ignored(make: Callable[..., Harness]) -> None:
    h = make()
    h.send("POSITION s w1 0 0")
    h.send(
        rd("w1", None, "a"),
        rd("w1", None, "b"),
        rd("w1", 4, "c", n=3),
    )
    h.send(rd("w1", 4, "c", prev=0), rd("w1", 3, "old", prev=0))
    await h.settle()
    assert h.applied == [("w1", 4, ["a", "b", "c"])]
    assert h.dropped("duplicate") == 2


async def test_gap_found_by_position_is_fetched_in_pages_in_order(make: Callable[..., Harness]) -> None:
    h = make(batch=3)
    h.send("POSITION s w1 0 0")
    for token in range(1, 9):
        h.table.add("w1", token, Row(payload=f"r{token}"))
    h.table.add("w1", 8, Row(payload="r8b"))  # two rows share token 8
    h.send(rd("w1", 1, "r1"))  # 2..8 were "lost"
    h.send("POSITION s w1 8 10")
    await h.settle()
    assert [t for _, t, _ in h.applied] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert h.applied[-1] == ("w1", 8, ["r8", "r8b"])
    assert h.position("w1") == 10
    assert len(h.table.calls) >= 3  # paginated
    assert all(limit <= 6 for *_, limit in h.table.calls)


async def test_page_holding_a_single_token_is_refetched_whole(make: Callable[..., Harness]) -> None:
    h = make(batch=2)
    h.send("POSITION s w1 0 0")
    for i in range(5):
        h.table.add("w1", 3, Row(payload=f"x{i}"))
    h.send("POSITION s w1 3 3")
    await h.settle()
    assert h.applied == [("w1", 3, [f"x{i}" for i in range(5)])]


async def test_apply_runs_before_advance_and_listeners_after(make: Callable[..., Harness]) -> None:
    h = make()
    h.send("POSITION s w1 0 0", rd("w1", 5, "a"))
    await h.settle()
    assert h.events == ["apply 5 pos=0", "listener 5 pos=5"]


async def test_forged_and_invalid_input_never_moves_a_position(make: Callable[..., Harness]) -> None:
    h = make()
    h.send("POSITION s w1 0 0")
    await h.settle()
    h.send(
        rd("intruder", 9, "x"),
        "POSITION s intruder 0 9",
        rd("w1", 9, "x", stream="nosuch"),
        rd("w1", 9, 5),
        'RDATA s w1 9 [0, 1, "x", "nope"]',
        'RDATA s w1 9 {"prev": 0, "n": 1, "row": {"payload": "x", "n": 0}}',
        "POSITION s me 0 9",
        rd("w1", 9, "x", stream="elsewhere"),
    )
    await h.settle()
    assert h.applied == []
    assert h.position("w1") == 0
    assert h.rejected("not_a_writer") == 2
    assert h.dropped("unknown_stream") == 1  # a newer release's stream: skipped, not forged
    assert h.rejected("invalid_row") == 3
    assert h.dropped("echo") == 1
    assert h.dropped("not_subscribed") == 1


async def test_invalid_row_in_a_batch_waits_for_position_and_catches_up(make: Callable[..., Harness]) -> None:
    h = make()
    h.send("POSITION s w1 0 0")
    h.table.add("w1", 2, Row(payload="a"))
    h.table.add("w1", 2, Row(payload="b"))
    h.send(
        rd("w1", None, "a"),
        rd("w1", None, 1),
        rd("w1", 2, "b", n=3),
    )
    await h.settle()
    assert h.applied == []
    h.send("POSITION s w1 2 2")
    await h.settle()
    assert h.applied == [("w1", 2, ["a", "b"])]


async def test_connection_loss_drops_queued_and_waits_for_position(make: Callable[..., Harness]) -> None:
    h = make()
    h.send("POSITION s w1 0 0")
    await h.settle()
    h.send(rd("w1", 1, "a"))
    h.handler.connection_lost()
    h.send(rd("w1", 2, "b", prev=1))
    await h.settle()
    assert h.applied == []
    assert h.dropped("stale_connection") == 1
    assert not h.handler.is_connected("s", "w1")


async def test_overflow_drops_backlog_then_catches_up(make: Callable[..., Harness]) -> None:
    h = make(queue_size=5)
    h.send("POSITION s w1 0 0")
    await h.settle()
    for token in range(1, 21):
        h.table.add("w1", token, Row(payload=f"r{token}"))
        h.send(rd("w1", token, f"r{token}", prev=token - 1))
    assert len(h.handler._states["s"].queue) <= 5
    await h.settle()
    h.send("POSITION s w1 20 20")
    await h.settle()
    assert [t for _, t, _ in h.applied] == list(range(1, 21))
    assert h.dropped("backlog_overflow") > 0


async def test_failed_apply_is_retried_by_the_next_position(make: Callable[..., Harness]) -> None:
    failures = {"left": 1}

    def fail_once(token: int) -> bool:
        if token == 3 and failures["left"]:
            failures["left"] -= 1
            return True
        return False

    h = make(fail_on=fail_once)
    h.send("POSITION s w1 0 0")
    for token in (1, 2, 3):
        h.table.add("w1", token, Row(payload=f"r{token}"))
    h.send(rd("w1", 1, "r1"))
    await h.settle()
    h.send(rd("w1", 2, "r2", prev=1), rd("w1", 3, "r3", prev=2))  # one apply for both: it fails
    await h.settle()
    assert [t for _, t, _ in h.applied] == [1]
    assert h.position("w1") == 1
    h.send("POSITION s w1 3 3")
    await h.settle()
    assert [t for _, t, _ in h.applied] == [1, 2, 3]


async def test_writer_restart_position_below_ours_fetches_nothing(make: Callable[..., Harness]) -> None:
    h = make()
    h.send("POSITION s w1 0 7")
    await h.settle()
    h.send("POSITION s w1 3 3")
    await h.settle()
    assert h.position("w1") == 7
    assert h.handler.is_connected("s", "w1")


async def test_a_lost_rdata_between_two_others_is_noticed_and_healed_in_order(
    make: Callable[..., Harness],
) -> None:
    h = make()
    h.send("POSITION s w1 0 0")
    for token in (2, 5, 9):
        h.table.add("w1", token, Row(payload=f"r{token}"))
    h.send(rd("w1", 2, "r2"), rd("w1", 9, "r9", prev=5))  # RDATA 5 was lost
    await h.settle()
    assert [t for _, t, _ in h.applied] == [2]
    assert h.dropped("gap") == 1
    h.send("POSITION s w1 9 9")
    await h.settle()
    assert [t for _, t, _ in h.applied] == [2, 5, 9]


async def test_a_lost_batch_row_is_noticed(make: Callable[..., Harness]) -> None:
    h = make()
    h.send("POSITION s w1 0 0")
    h.table.add("w1", 3, Row(payload="a"))
    h.table.add("w1", 3, Row(payload="b"))
    h.send(rd("w1", 3, "b", n=2))  # the batch row "a" was lost
    await h.settle()
    assert h.applied == []
    h.send("POSITION s w1 3 3")
    await h.settle()
    assert h.applied == [("w1", 3, ["a", "b"])]


async def test_own_lines_are_dropped_by_prefix_before_parsing(make: Callable[..., Harness]) -> None:
    """A writer hears its own RDATA/POSITION on a shared channel: skipped without parsing or validating."""
    h = make()
    h.send(
        rd("me", 3, "x"),
        "POSITION s me 0 3",
        "RDATA s me not-a-token {",  # ours by name: never parsed, so not a rejection either
        rd("me", 3, "x", stream="elsewhere"),
        rd("meme", 3, "x"),  # a longer name with our name as prefix is not ours
    )
    await h.settle()
    assert h.dropped("echo") == 3
    assert h.dropped("not_subscribed") == 1
    assert h.rejected("not_a_writer") == 1
    assert h.rejected("bad_token") == 0
    assert h.applied == []


async def test_a_line_claiming_our_name_beyond_our_commits_is_an_alarm_and_moves_nothing(
    make: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    """Someone else publishing under our name (issue 24's forged echo): ignored for our state,
    counted, and logged at ERROR, once per interval; our own echoes within what we reached are not."""
    h = make()
    own = h.handler.streams["s"].generator
    own.advance("me", 5)
    h.send(rd("me", 4, "x"), "POSITION s me 4 5")  # genuine echoes
    await h.settle()
    assert h.rejected("conflicting_own_name") == 0
    h.send("POSITION s me 70 1000000000000000", rd("me", 9, "y"), "POSITION s me 5 9")
    await h.settle()
    assert h.rejected("conflicting_own_name") == 2  # the POSITION lines (rows are not parsed)
    assert h.position("me") == 5 and h.applied == []
    alarms = [r for r in caplog.records if "ALARM" in r.getMessage()]
    assert len(alarms) == 1 and alarms[0].levelname == "ERROR"


async def test_an_own_position_above_64_bits_is_malformed_not_an_alarm(
    make: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    """The 64-bit bound comes before the own-name check: 2**63 is no position anyone committed."""
    h = make()
    h.send(f"POSITION s me 0 {2**63}")
    h.handler.handle_line(f"POSITION s me 0 {2**63}".encode(), 0.0)  # the line-at-a-time path too
    await h.settle()
    assert h.rejected("token_too_large") == 2
    assert h.rejected("conflicting_own_name") == 0 and h.dropped("echo") == 0
    assert h.position("me") == 0 and h.applied == []
    refused = [r for r in caplog.records if "token_too_large" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelname == "WARNING"  # rate-limited to one line
    assert not [r for r in caplog.records if "ALARM" in r.getMessage()]


async def test_rows_of_the_next_and_the_previous_release_are_read(
    make: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    """Additive changes across one release: trailing fields a reader does not know are ignored, a
    missing trailing field with a default takes it, a stream it does not know is skipped and
    counted, and none of these is a rejection."""
    caplog.set_level("INFO", logger="pubsub.handler")
    h = make()
    h.send("POSITION s w1 0 0")
    h.send(
        'RDATA s w1 1 [0,1,"a",3,"a field of the next release",{"k":[1]}]',
        'RDATA s w1 2 [1,1,"b"]',  # the previous release's row, before `n` existed
        'RDATA s w1 batch ["c",5,null]',
        'RDATA s w1 3 [2,2,"d",6,7]',
        'RDATA receipts w1 4 [3,1,"!r:hs","m.read"]',
        "POSITION receipts w1 3 4",
    )
    h.handler.handle_line('RDATA s w1 4 [3,1,"é",1,"x"]', 0.0)  # not ASCII: the general path
    await h.settle()
    rows = [row for _, _, payloads in h.applied for row in payloads]
    assert rows == ["a", "b", "c", "d", "é"]
    assert h.handler.metrics.rejected == {}
    assert h.dropped("unknown_stream") == 2
    skipped = [r for r in caplog.records if "unknown stream=receipts" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].levelname == "INFO"


async def test_metrics_are_plain_counters_exposed_at_collection(make: Callable[..., Harness]) -> None:
    h = make()
    h.send("POSITION s w1 0 0", rd("w1", 4, "x"), "POSITION s w1 4 6", "BOGUS")
    await h.settle()
    metrics = h.handler.metrics
    assert metrics.value("fanout_repl_commands_in_total", {"command": "RDATA", "stream": "s"}) == 1
    assert metrics.value("fanout_repl_commands_in_total", {"command": "POSITION", "stream": "s"}) == 2
    assert metrics.value("fanout_repl_bytes_in_total") == sum(
        len(x) for x in ["POSITION s w1 0 0", rd("w1", 4, "x"), "POSITION s w1 4 6", "BOGUS"]
    )
    assert metrics.value("fanout_repl_rejected_total", {"reason": "unknown_command"}) == 1
    # Positions and lags are read live from the stream when collected.
    assert metrics.value("fanout_repl_position", {"stream": "s", "writer": "w1"}) == 6
    assert metrics.value("fanout_repl_position", {"stream": "s", "writer": "w2"}) == 0
    assert metrics.value("fanout_repl_lag", {"stream": "s", "writer": "w1"}) == 0
    names = {m.name for m in metrics.registry.collect()}
    assert {"fanout_repl_dropped", "fanout_repl_reconnects", "fanout_repl_catch_up_rows"} <= names


async def test_single_row_tokens_queued_back_to_back_are_applied_together(
    make: Callable[..., Harness],
) -> None:
    """One apply (and one advance, one wake-up) for a run of single-row tokens of one writer; the
    run ends at anything that does not continue the writer's chain."""
    h = make()
    h.send("POSITION s w1 0 0", "POSITION s w2 0 0")
    await h.settle()
    h.send(
        rd("w1", 1, "a"), rd("w1", 2, "b", prev=1), rd("w1", 3, "c", prev=2),
        rd("w2", 1, "x"),  # another writer ends the run
        rd("w1", 4, "d", prev=3), rd("w1", 5, "e", prev=4),
        rd("w1", 3, "c-again", prev=2),  # a duplicate is not folded in (and then ignored)
        rd("w1", 6, "f", prev=5),
    )  # fmt: skip
    await h.settle()
    assert h.applied == [
        ("w1", 3, ["a", "b", "c"]),
        ("w2", 1, ["x"]),
        ("w1", 5, ["d", "e"]),
        ("w1", 6, ["f"]),
    ]
    assert h.dropped("duplicate") == 1
    assert h.position("w1") == 6


async def test_a_positions_only_stream_advances_writers_without_applying_or_fetching(
    make: Callable[..., Harness],
) -> None:
    h = make(positions_only=True)
    h.table.add("w1", 3, Row(payload="never fetched"))
    h.send(rd("w1", 2, "a"))  # before any POSITION: a numbered row's token is a position too
    await h.settle()
    assert h.position("w1") == 2
    h.send(rd("w1", None, "b"), rd("w1", 5, "c", prev=4, n=2), rd("w2", 4, "d"))
    h.send("POSITION s w1 9 12")  # behind prev: a full reader would catch up from the database
    await h.settle()
    assert (h.position("w1"), h.position("w2")) == (12, 4)
    assert h.applied == [] and h.table.calls == []
    assert h.events == ["listener 2 pos=2", "listener 5 pos=5", "listener 4 pos=4", "listener 12 pos=12"]
    assert h.handler.is_connected("s", "w1")


async def test_a_positions_only_stream_still_rejects_forged_and_malformed_lines(
    make: Callable[..., Harness],
) -> None:
    h = make(positions_only=True)
    h.send(
        rd("intruder", 9, "x"),
        "POSITION s intruder 0 9",
        "RDATA s w1 09 [0,1]",
        "RDATA s w1 9\r [0,1]",
        "POSITION s w1 0 x9",
    )
    await h.settle()
    assert (h.position("w1"), h.position("w2")) == (0, 0)
    assert h.rejected("not_a_writer") == 2
    assert h.handler.metrics.value("fanout_repl_rejected_total") == 5


def test_positions_only_must_name_read_streams() -> None:
    with pytest.raises(ValueError, match="elsewhere"):
        ReplicationHandler(
            "me",
            StreamRegistry([memory_stream("s", ["w1"], MemoryTable())]),
            _never,
            metrics=ReplicationMetrics(),
            positions_only=["elsewhere"],
        )


async def _never(*_: object) -> None:
    raise AssertionError("no rows are applied")


async def test_writers_changed_while_running(make: Callable[..., Harness]) -> None:
    """A writer added is heard from then on (its RDATA after its first POSITION); one that can
    write no more is settled from the table up to the end given; a removed one is refused."""
    h = make()
    h.send("POSITION s w3 0 1")
    await h.settle()
    assert h.rejected("not_a_writer") == 1
    h.handler.set_writers("s", ["w1", "w2", "w3"])
    h.send("POSITION s w3 0 0", rd("w3", 2, "x"))
    await h.settle()
    assert h.applied == [("w3", 2, ["x"])]
    h.table.add("w3", 5, Row(payload="y"))  # committed, its RDATA lost, then w3 stopped
    h.handler.settle("s", "w3", 5)
    await h.settle()
    assert h.applied[-1] == ("w3", 5, ["y"]) and h.position("w3") == 5
    h.handler.set_writers("s", ["w1", "w2"])
    h.send(rd("w3", 6, "z", prev=5))
    await h.settle()
    assert h.rejected("not_a_writer") == 2 and h.applied[-1][1] == 5
