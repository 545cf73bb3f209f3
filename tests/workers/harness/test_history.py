"""The history checker must catch what it claims to catch: each broken history is flagged."""

from __future__ import annotations

from workers.harness.history import StoredEvent, SyncRecord, check_history, visible_events

IDS = {"p1": 1, "p2": 2}
ALICE = "@alice"


def _event(
    ordering: int, writer: str, event_id: str, *, room: str = "!r", member: str | None = None
) -> StoredEvent:
    if member is not None:
        return StoredEvent(ordering, writer, event_id, room, "m.room.member", ALICE, member)
    return StoredEvent(ordering, writer, event_id, room, "m.room.message", None, None)


STORED = [
    _event(1, "p1", "$join", member="join"),
    _event(2, "p2", "$a"),
    _event(3, "p1", "$b"),
    _event(4, "p2", "$c"),
    _event(5, "p1", "$other", room="!elsewhere"),
]


def _record(since: str, upto: str, *ids: str) -> SyncRecord:
    return SyncRecord("sync1", since, upto, ids)


def test_a_correct_history_passes() -> None:
    records = [_record("s0", "m1~2.2", "$join", "$a"), _record("m1~2.2", "s4", "$b", "$c")]
    assert check_history(ALICE, records, STORED, IDS) == []


def test_duplicate_is_caught() -> None:
    records = [_record("s0", "m1~2.2", "$join", "$a"), _record("m1~2.2", "s4", "$a", "$b", "$c")]
    problems = check_history(ALICE, records, STORED, IDS)
    assert any("$a delivered twice" in p for p in problems), problems


def test_gap_is_caught() -> None:
    records = [_record("s0", "m1~2.2", "$join", "$a"), _record("m1~2.2", "s4", "$c")]
    problems = check_history(ALICE, records, STORED, IDS)
    assert any("missed $b" in p for p in problems), problems


def test_token_going_backwards_is_caught() -> None:
    records = [_record("s0", "s4", "$join", "$a", "$b", "$c"), _record("s4", "s3")]
    problems = check_history(ALICE, records, STORED, IDS)
    assert any("went backwards" in p for p in problems), problems


def test_restarting_from_an_older_token_is_caught() -> None:
    records = [_record("s0", "s3", "$join", "$a", "$b"), _record("s2", "s4", "$c")]
    problems = check_history(ALICE, records, STORED, IDS)
    assert any("before the previous next_batch" in p for p in problems), problems


def test_event_outside_its_window_and_foreign_room_are_caught() -> None:
    records = [_record("s0", "m1~2.2", "$join", "$a", "$b"), _record("m1~2.2", "s5", "$c", "$other")]
    problems = check_history(ALICE, records, STORED, IDS)
    assert any("$b (3) outside its window" in p for p in problems), problems
    assert any("$other which it may not see" in p for p in problems), problems


def test_visibility_follows_membership_in_stream_order() -> None:
    stored = [
        _event(1, "p1", "$before"),
        _event(2, "p1", "$join", member="join"),
        _event(3, "p1", "$during"),
        _event(4, "p1", "$leave", member="leave"),
        _event(5, "p1", "$after"),
        _event(-1, "p1", "$backfilled"),
    ]
    assert [e.event_id for e in visible_events(ALICE, stored)] == ["$join", "$during", "$leave"]


def test_the_chaos_table_counts_each_kind_of_finding() -> None:
    """`make chaos` sorts the checker's findings into lost, duplicated and reordered: planted faults
    land in their columns."""
    from workers.harness.chaos import classify

    lost = check_history(ALICE, [_record("s0", "s4", "$join", "$a", "$c")], STORED, IDS)
    twice = check_history(ALICE, [_record("s0", "s4", "$join", "$a", "$a", "$b", "$c")], STORED, IDS)
    reordered = check_history(ALICE, [_record("s0", "s4", "$join", "$b", "$a", "$c")], STORED, IDS)
    assert classify(lost)["lost"] == 1
    assert classify(twice)["duplicated"] == 1
    assert classify(reordered)["reordered"] >= 1
    assert classify([]) == {"lost": 0, "duplicated": 0, "reordered": 0, "other": 0}
