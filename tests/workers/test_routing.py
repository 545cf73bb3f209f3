"""workers.routing: rooms spread over writers, stably."""

from __future__ import annotations

import pytest

from workers.routing import RoomPlacement, plan_writers, writer_for_room


def test_rooms_spread_over_writers_stably() -> None:
    writers = ["p1", "p2"]
    owners = {writer_for_room(f"!room{i}", writers) for i in range(50)}
    assert owners == {"p1", "p2"}
    assert writer_for_room("!x", writers) == writer_for_room("!x", writers)
    with pytest.raises(ValueError):
        writer_for_room("!x", [])


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_placement_follows_the_holder_and_routes_around_a_writer_that_stops() -> None:
    clock = _Clock()
    placement = RoomPlacement(["p1", "p2"], clock, away_s=5.0)
    room = next(f"!r{i}" for i in range(100) if writer_for_room(f"!r{i}", ["p1", "p2"]) == "p1")
    assert placement.owner(room) == "p1"  # no holder known: the stable choice
    placement.learned(room, "p2")
    assert placement.owner(room) == "p2"  # the holder, wherever the hash points
    placement.unavailable("p2")
    assert placement.owner(room) == "p1"  # the holder stops: the stable choice among the others
    placement.unavailable("p1")
    assert placement.owner(room) == "p1"  # everyone away: the stable choice over all
    clock.now = 6.0
    assert placement.owner(room) == "p2"  # back after away_s


def test_placement_forgets_the_oldest_holders_past_its_bound() -> None:
    placement = RoomPlacement(["p1", "p2"], _Clock(), max_rooms=2)
    for room in ("!a", "!b", "!c"):
        placement.learned(room, "p2")
    assert placement.owner("!a") == writer_for_room("!a", ["p1", "p2"])
    assert placement.owner("!c") == "p2"


def test_a_writer_plan_lists_what_moves() -> None:
    users = [f"@u{i}:hs" for i in range(40)]
    rooms = [f"!r{i}:hs" for i in range(40)]
    held = {("account_data", "@held1:hs"): "p3", ("receipts", "!held1:hs"): "p1"}
    plan = plan_writers(
        ["p1", "p2", "p3"], ["p1", "p2"], {"!held1:hs": "p3", "!held2:hs": "p1"}, rooms, users, held
    )
    assert plan.added == [] and plan.removed == ["p3"]
    # Every room held by the writer that leaves; a room held by one that stays, if its stable
    # choice changed (the reload rebalances it).
    assert ("!held1:hs", "p3", writer_for_room("!held1:hs", ["p1", "p2"])) in plan.rooms_moving
    stays = writer_for_room("!held2:hs", ["p1", "p2"]) == "p1"
    assert (("!held2:hs", "p1", "p2") in plan.rooms_moving) is not stays
    assert len(plan.rooms_moving) == 1 + (not stays)
    assert plan.keys_moving == (("account_data", "@held1:hs", "p3"),)
    assert {a for _, a, _ in plan.unleased_moving} <= {"p1", "p2", "p3"}
    assert all(writer_for_room(r, ["p1", "p2", "p3"]) == a for r, a, _ in plan.unleased_moving)
    assert all(writer_for_room(r, ["p1", "p2"]) == b for r, _, b in plan.unleased_moving)
    assert plan.unleased_moving and plan.users_moving  # a third of 40 hash to p3
    unchanged = plan_writers(["p1", "p2"], ["p1", "p2"], {"!a": "p1"}, rooms, users)
    assert unchanged.rooms_moving == unchanged.unleased_moving == unchanged.users_moving == ()
    assert unchanged.keys_moving == ()
    with pytest.raises(ValueError):
        plan_writers(["p1"], [], {}, [], [])
