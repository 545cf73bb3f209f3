"""The history visibility rules on their own, per value, in and out of a sync window."""

from __future__ import annotations

from workers.handlers.rooms.history_visibility import all_permissive, current, may_see, visibility_at

# The user: invited at 10, joined at 20, left at 30, joined again at 40.
MEMBERSHIP = ((10, "invite"), (20, "join"), (30, "leave"), (40, "join"))


def sees(ordering: int, visibility: str, joined_by: int | None = None) -> bool:
    return may_see(ordering, False, MEMBERSHIP, ((1, visibility),), joined_by=joined_by)


def test_joined_shows_only_what_happened_while_joined() -> None:
    assert [sees(o, "joined") for o in (5, 15, 25, 35, 45)] == [False, False, True, False, True]


def test_invited_adds_the_time_since_the_invite() -> None:
    assert [sees(o, "invited") for o in (5, 15, 25, 35, 45)] == [False, True, True, False, True]


def test_shared_shows_everything_before_a_later_join() -> None:
    assert [sees(o, "shared") for o in (5, 15, 25, 35, 45)] == [True, True, True, True, True]
    left_for_good = ((20, "join"), (30, "leave"))
    assert not may_see(35, False, left_for_good, ((1, "shared"),))


def test_world_readable_shows_everything_outside_a_window_and_acts_as_shared_inside_one() -> None:
    assert may_see(35, False, ((20, "join"), (30, "leave")), ((1, "world_readable"),))
    assert not may_see(35, False, ((20, "join"), (30, "leave")), ((1, "world_readable"),), joined_by=100)


def test_a_window_counts_only_joins_inside_it() -> None:
    assert sees(35, "shared", joined_by=45) and not sees(35, "shared", joined_by=39)
    assert sees(15, "invited", joined_by=20) and not sees(15, "invited", joined_by=19)
    assert not sees(5, "invited", joined_by=100)  # not invited yet at 5


def test_the_own_member_event_is_always_seen_and_a_change_counts_its_wider_side() -> None:
    assert may_see(10, True, MEMBERSHIP, ((1, "joined"),))
    changes = ((1, "shared"), (35, "joined"))
    assert visibility_at(changes, 35, is_change=True) == "shared"
    assert visibility_at(changes, 36) == "joined"
    assert current(changes) == "joined" and current(()) == "shared"
    assert all_permissive(((1, "shared"), (2, "world_readable"))) and not all_permissive(changes)
    assert visibility_at(((1, "nonsense"),), 5) == "joined"  # unknown: the narrowest
