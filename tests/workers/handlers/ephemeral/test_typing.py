"""TypingRooms (timeouts, change detection) and TypingView (sections, resets) on their own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workers.handlers.ephemeral.typing import TypingRooms, TypingView

ROOMS = st.sampled_from(["!a:x", "!b:x"])
USERS = st.sampled_from(["@u:x", "@v:x", "@w:x"])
OPS = st.lists(
    st.tuples(ROOMS, USERS, st.booleans(), st.integers(0, 40_000), st.integers(0, 5_000)), max_size=40
)


def test_typing_until_the_timeout_then_not() -> None:
    rooms = TypingRooms()
    assert rooms.set_typing("!a:x", "@u:x", True, 1000, now_ms=0) == [("!a:x", ("@u:x",))]
    assert rooms.set_typing("!a:x", "@u:x", True, 1000, now_ms=500) == []  # only the expiry moves
    assert rooms.expire(1000) == []
    assert rooms.expire(1500) == [("!a:x", ())]
    assert rooms.snapshot() == {}


def test_timeouts_are_capped_and_stopping_is_a_change_once() -> None:
    rooms = TypingRooms(max_timeout_ms=30_000)
    rooms.set_typing("!a:x", "@u:x", True, 10**9, now_ms=0)
    assert rooms.next_expiry_ms() == 30_000
    assert rooms.set_typing("!a:x", "@u:x", False, 0, now_ms=1) == [("!a:x", ())]
    assert rooms.set_typing("!a:x", "@u:x", False, 0, now_ms=2) == []


@given(OPS)
def test_a_view_fed_the_changes_equals_the_writer_state(ops: list[tuple[str, str, bool, int, int]]) -> None:
    """Whatever the sequence, applying every returned change reproduces the writer's state, and no
    entry outlives its (capped) timeout."""
    rooms, view, now, token = TypingRooms(), TypingView(), 0, 0
    for room, user, typing, timeout, step in ops:
        now += step
        for changed_room, users in rooms.expire(now) + rooms.set_typing(room, user, typing, timeout, now):
            token += 1
            view.apply(token, changed_room, users)
        expiry = rooms.next_expiry_ms()
        assert expiry is None or expiry <= now + rooms.max_timeout_ms
    for room in ("!a:x", "!b:x"):
        assert view.users(room) == rooms.users(room)


@given(OPS, OPS)
def test_reset_rows_turn_any_view_into_the_snapshot(
    before: list[tuple[str, str, bool, int, int]], after: list[tuple[str, str, bool, int, int]]
) -> None:
    old, new, view = TypingRooms(), TypingRooms(), TypingView()
    for room, user, typing, timeout, _ in before:
        for changed_room, users in old.set_typing(room, user, typing, timeout, 0):
            view.apply(1, changed_room, users)
    for room, user, typing, timeout, _ in after:
        new.set_typing(room, user, typing, timeout, 0)
    for room, users in view.reset_rows(new.snapshot()):
        view.apply(2, room, users)
    for room in ("!a:x", "!b:x"):
        assert view.users(room) == new.users(room)


def test_sections_initial_and_incremental() -> None:
    view = TypingView()
    view.apply(5, "!a:x", ("@u:x",))
    view.apply(6, "!b:x", ())
    assert view.section(["!a:x", "!b:x", "!c:x"]) == {
        "!a:x": {"type": "m.typing", "content": {"user_ids": ["@u:x"]}}
    }
    assert view.section(["!a:x", "!b:x"], since=5) == {
        "!b:x": {"type": "m.typing", "content": {"user_ids": []}}
    }
    assert view.section(["!a:x", "!b:x"], since=6) == {}
