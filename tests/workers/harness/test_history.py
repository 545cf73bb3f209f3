"""The history checker must catch what it claims to catch: each broken history is flagged."""

from __future__ import annotations

from workers.harness.history import (
    StoredChange,
    StoredEvent,
    SyncRecord,
    check_history,
    check_one_time_keys,
    check_receipts,
    check_stored_streams,
    visible_events,
)

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


def _stored_token(events: int, account_data: str = "s0", device_lists: str = "s0") -> str:
    return f"s{events}_s0_s0_s0_{account_data}_{device_lists}_s0"


CHANGES = [
    StoredChange("account_data", ALICE, "t.one", 1, "p1"),
    StoredChange("account_data", ALICE, "t.two", 2, "p2"),
    StoredChange("account_data", "@bob", "t.bob", 3, "p1"),
    StoredChange("device_lists", ALICE, "", 2, "p1"),
]


def _stored_record(since: str, upto: str, data: tuple[str, ...] = (), msgs: tuple[str, ...] = (),
                   changed: tuple[str, ...] = ()) -> SyncRecord:  # fmt: skip
    return SyncRecord("sync1", since, upto, (), data, msgs, changed)


def test_the_stored_streams_check_passes_a_correct_history_and_catches_each_fault() -> None:
    good = [
        _stored_record(_stored_token(0), _stored_token(0, "m0~1.1", "s1"), ("t.one",)),
        _stored_record(
            _stored_token(0, "m0~1.1", "s1"), _stored_token(0, "s3", "s3"), ("t.two",), ("m1", "m2"), (ALICE,)
        ),
    ]
    sent = [("m1", True, "@bob"), ("m2", True, "@bob"), ("m3", False, "@bob"), ("m4", False, "@carol")]
    assert check_stored_streams(ALICE, good, CHANGES, sent, IDS) == []
    twice = [
        good[0],
        _stored_record(good[1].since, good[1].next_batch, ("t.one", "t.two"), ("m1", "m2"), (ALICE,)),
    ]
    assert any("t.one delivered twice" in p for p in check_stored_streams(ALICE, twice, CHANGES, sent, IDS))
    lost = [good[0], _stored_record(good[1].since, good[1].next_batch, (), ("m2",), (ALICE,))]
    problems = check_stored_streams(ALICE, lost, CHANGES, sent, IDS)
    assert any("missed account data t.two" in p for p in problems), problems
    assert any("missed to-device message m1" in p for p in problems), problems
    reordered = [
        good[0],
        _stored_record(good[1].since, good[1].next_batch, ("t.two",), ("m2", "m1"), (ALICE,)),
    ]
    assert any(
        "m1 not in stream order" in p for p in check_stored_streams(ALICE, reordered, CHANGES, sent, IDS)
    )
    unlisted = [good[0], _stored_record(good[1].since, good[1].next_batch, ("t.two",), ("m1", "m2"))]
    assert any(
        "missed its own device-list change" in p
        for p in check_stored_streams(ALICE, unlisted, CHANGES, sent, IDS)
    )
    spurious = [_stored_record(good[0].since, good[0].next_batch, ("t.one",), (), (ALICE,)), good[1]]
    assert any(
        "no change in its window" in p for p in check_stored_streams(ALICE, spurious, CHANGES, sent, IDS)
    )
    outside = [_stored_record(good[0].since, good[0].next_batch, ("t.one", "t.two")), good[1]]
    assert any(
        "outside its sync's window" in p for p in check_stored_streams(ALICE, outside, CHANGES, sent, IDS)
    )


CHURN = [
    _event(1, "p1", "$join", member="join"),
    _event(2, "p1", "$msg"),
    _event(3, "p1", "$leave", member="leave"),
    _event(4, "p1", "$invite", member="invite"),
    _event(5, "p1", "$invite2", member="invite"),
]


def _listed(since: str, upto: str, ids: tuple[str, ...], *sections: str) -> SyncRecord:
    return SyncRecord("sync1", since, upto, ids, sections=tuple((s, "!r") for s in sections))


def test_a_window_that_ends_in_an_invite_must_list_the_room_under_leave_too() -> None:
    every = ("$join", "$msg", "$leave", "$invite2")
    good = [_listed("s0", "s5", every, "leave", "invite")]
    assert check_history(ALICE, good, CHURN, IDS) == []
    only_invite = [_listed("s0", "s5", ("$invite2",), "invite")]
    problems = check_history(ALICE, only_invite, CHURN, IDS)
    assert any("did not list !r under leave" in p for p in problems), problems
    assert any("missed $msg" in p for p in problems), problems


def test_an_invite_superseded_in_its_window_is_not_expected_but_one_in_its_own_window_is() -> None:
    one_window = [_listed("s0", "s5", ("$join", "$msg", "$leave", "$invite2"), "leave", "invite")]
    assert check_history(ALICE, one_window, CHURN, IDS) == []
    split = [
        _listed("s0", "s4", ("$join", "$msg", "$leave", "$invite"), "leave", "invite"),
        _listed("s4", "s5", ("$invite2",), "invite"),
    ]
    assert check_history(ALICE, split, CHURN, IDS) == []
    missing = [split[0], _listed("s4", "s5", (), "invite")]
    problems = check_history(ALICE, missing, CHURN, IDS)
    assert any("missed $invite2" in p for p in problems), problems
    unlisted = [split[0], _listed("s4", "s5", ("$invite2",))]
    problems = check_history(ALICE, unlisted, CHURN, IDS)
    assert any("did not list !r under invite" in p for p in problems), problems


SHARED_ROOM = [
    _event(1, "p1", "$before"),
    _event(2, "p1", "$join", member="join"),
    _event(3, "p1", "$leave", member="leave"),
    _event(4, "p1", "$away"),
    StoredEvent(5, "p1", "$narrow", "!r", "m.room.history_visibility", "", None, "joined"),
    _event(6, "p1", "$hidden"),
    _event(7, "p1", "$back", member="join"),
]


def test_shared_history_counts_only_when_the_join_is_in_the_same_window() -> None:
    one = [_listed("s0", "s7", ("$before", "$join", "$leave", "$away", "$narrow", "$back"), "join")]
    assert check_history(ALICE, one, SHARED_ROOM, IDS) == []  # $hidden: joined-only when sent
    split = [
        _listed("s0", "s3", ("$before", "$join", "$leave"), "leave"),
        _listed("s3", "s7", ("$away", "$narrow", "$back"), "join"),
    ]
    assert check_history(ALICE, split, SHARED_ROOM, IDS) == []  # $before: joins in its window
    too_much = [
        _listed("s0", "s1", ("$before",)),
        _listed("s1", "s7", ("$join", "$leave", "$away", "$narrow", "$back"), "join"),
    ]
    problems = check_history(ALICE, too_much, SHARED_ROOM, IDS)
    assert any("got $before which it may not see" in p for p in problems), problems
    missing = [_listed("s0", "s7", ("$join", "$leave", "$narrow", "$back"), "join")]
    problems = check_history(ALICE, missing, SHARED_ROOM, IDS)
    assert any("missed $before" in p for p in problems) and any("missed $away" in p for p in problems)


def test_receipts_private_ones_and_stale_last_values_are_caught() -> None:
    written = {("!r", "m.read", "@bob"): "$b", ("!r", "m.read.private", "@bob"): "$b"}
    good = [SyncRecord("s", "s0", "s1", (), receipts=(("!r", "m.read", "@bob", "$a"),)),
            SyncRecord("s", "s1", "s2", (), receipts=(("!r", "m.read", "@bob", "$b"),))]  # fmt: skip
    assert check_receipts(ALICE, good, written, ["!r"]) == []
    stale = good[:1]
    assert any("last m.read" in p for p in check_receipts(ALICE, stale, written, ["!r"]))
    assert check_receipts(ALICE, stale, written, []) == []  # not watched: a value, not a log
    private = [SyncRecord("s", "s0", "s1", (), receipts=(("!r", "m.read.private", "@bob", "$b"),))]
    assert any("private receipt" in p for p in check_receipts(ALICE, private, written))
    forged = [SyncRecord("s", "s0", "s1", (), receipts=(("!x", "m.read", "@eve", "$b"),))]
    assert any("nobody set" in p for p in check_receipts(ALICE, forged, written))


def test_one_time_keys_claimed_twice_foreign_or_miscounted_are_caught() -> None:
    records = [SyncRecord("s", "s0", "s1", (), one_time_keys=1)]
    assert check_one_time_keys(ALICE, records, ["k1", "k2", "k3"], ["k1", "k2"]) == []
    assert any(
        "claimed 2 times" in p for p in check_one_time_keys(ALICE, records, ["k1", "k2"], ["k1", "k1"])
    )
    assert any("never uploaded" in p for p in check_one_time_keys(ALICE, records, ["k1", "k2"], ["k9"]))
    assert any("counted 1" in p for p in check_one_time_keys(ALICE, records, ["k1", "k2"], []))


def _limited(since: str, upto: str, ids: tuple[str, ...], filled: tuple[str, ...] | None, *,
             prev_batch: bool = True, worker: str = "sync1") -> SyncRecord:  # fmt: skip
    """An answer whose room !r timeline said limited; `filled`: the gap's events the client
    fetched with /messages (None: it never filled the gap)."""
    fills = () if filled is None else (("!r", filled),)
    return SyncRecord(worker, since, upto, ids, limited=(("!r", prev_batch),), filled=fills)


def test_a_limited_timeline_whose_gap_was_filled_passes() -> None:
    records = [_record("s0", "m1~2.2", "$join", "$a"), _limited("m1~2.2", "s4", ("$c",), ("$b",))]
    assert check_history(ALICE, records, STORED, IDS) == []


def test_a_limited_timeline_whose_gap_was_never_filled_is_caught() -> None:
    records = [_record("s0", "m1~2.2", "$join", "$a"), _limited("m1~2.2", "s4", ("$c",), None)]
    problems = check_history(ALICE, records, STORED, IDS)
    assert any("limited timeline of !r: gap never filled" in p for p in problems), problems
    assert any("missed $b" in p for p in problems), problems


def test_a_limited_timeline_without_prev_batch_is_caught() -> None:
    records = [
        _record("s0", "m1~2.2", "$join", "$a"),
        _limited("m1~2.2", "s4", ("$b", "$c"), None, prev_batch=False),
    ]
    problems = check_history(ALICE, records, STORED, IDS)
    assert any("limited, no prev_batch" in p for p in problems), problems


def test_a_duplicate_across_a_gap_fill_is_caught() -> None:
    """/messages went back past the previous answer's end: an event delivered by it comes again."""
    records = [_record("s0", "m1~2.2", "$join", "$a"), _limited("m1~2.2", "s4", ("$c",), ("$a", "$b"))]
    problems = check_history(ALICE, records, STORED, IDS)
    assert any("$a delivered twice" in p for p in problems), problems
    assert any("$a (2) outside its window" in p for p in problems), problems


def test_a_gap_fill_newer_than_its_timeline_is_caught() -> None:
    records = [_record("s0", "m1~2.2", "$join", "$a"), _limited("m1~2.2", "s4", ("$b",), ("$c",))]
    problems = check_history(ALICE, records, STORED, IDS)
    assert any("not in stream order at $b" in p for p in problems), problems


def test_a_worker_switch_that_went_backwards_is_caught() -> None:
    """A reader's next sync on the other worker answered a next_batch behind its since."""
    records = [
        _record("s0", "s3", "$join", "$a", "$b"),
        SyncRecord("sync2", "s3", "s2", ()),
        SyncRecord("sync1", "s2", "s4", ("$c",)),
    ]
    problems = check_history(ALICE, records, STORED, IDS)
    assert any("sync 1 went backwards (moved from sync1 to sync2)" in p for p in problems), problems
    hopping = [_record("s0", "m1~2.2", "$join", "$a"), SyncRecord("sync2", "m1~2.2", "s4", ("$b", "$c"))]
    assert check_history(ALICE, hopping, STORED, IDS) == []
