"""The racing pairs' check judges what was stored: each legal outcome passes, and a stored order the
Matrix rules refuse, an acknowledged change that was not stored, or a refusal of an allowed change
is flagged."""

from __future__ import annotations

import pytest

from workers.harness.membership_races import (
    PAIRS,
    RESULT,
    RaceOutcome,
    allowed,
    check_race,
    foreign,
    prepare,
)

JOIN, INVITE, BAN = ("me", "join"), ("owner", "invite"), ("owner", "ban")


def _race(name: str, start: str, accepted: list[tuple[tuple[str, str], int | None]],
          refused: tuple[tuple[str, str], ...] = ()) -> RaceOutcome:  # fmt: skip
    stored = tuple((move, f"${n}", ordering) for n, (move, ordering) in enumerate(accepted))
    return RaceOutcome(name, "!r", "@bob", start, stored, refused)


def test_the_legal_outcomes_of_join_vs_invite_pass_and_follow_the_stored_order() -> None:
    invite_then_join = _race("join-vs-invite", "invite", [(JOIN, 11), (INVITE, 10)])
    assert check_race(invite_then_join) == [] and invite_then_join.final() == "join"
    join_refuses_invite = _race("join-vs-invite", "invite", [(JOIN, 10)], (INVITE,))
    assert check_race(join_refuses_invite) == [] and join_refuses_invite.final() == "join"


def test_an_invite_of_a_joined_user_stored_after_its_join_is_caught() -> None:
    """Issue 42's race: both answered 200, stored join then invite: the user ends invited."""
    both = _race("join-vs-invite", "invite", [(JOIN, 10), (INVITE, 11)])
    problems = check_race(both)
    assert any("the owner's invite accepted" in p and "refuse it from join" in p for p in problems), problems
    assert both.final() == "invite"  # what was stored, which the load then carries on from


def test_a_join_stored_after_a_ban_is_caught() -> None:
    assert check_race(_race("ban-vs-join", "leave", [(JOIN, 10), (BAN, 11)])) == []
    problems = check_race(_race("ban-vs-join", "leave", [(BAN, 10), (JOIN, 11)]))
    assert any("the target's join accepted" in p for p in problems), problems


def test_an_acknowledged_change_missing_from_the_events_table_is_caught() -> None:
    problems = check_race(_race("kick-vs-join", "invite", [(("owner", "kick"), 10), (JOIN, None)]))
    assert any("answered 200 but is not stored" in p for p in problems), problems


def test_a_repeat_of_the_same_actors_membership_is_answered_without_an_event() -> None:
    """The owner's invite of a user the owner invited is a repeat (Synapse answers it with the
    stored invite): accepted and not stored passes, when the start was the owner's invite; the
    target's own join repeated after it was stored passes too; another actor's is still caught."""
    repeat = RaceOutcome("join-vs-invite", "!r", "@bob", "invite", ((INVITE, "", None), (JOIN, "$j", 11)),
                         (), start_by="owner")  # fmt: skip
    assert check_race(repeat) == [] and repeat.final() == "join"
    by_target = RaceOutcome(
        "join-vs-invite", "!r", "@bob", "invite", ((INVITE, "", None),), (), start_by="me"
    )
    assert any("answered 200 but is not stored" in p for p in check_race(by_target))
    after_join = RaceOutcome("kick-vs-join", "!r", "@bob", "invite", ((JOIN, "$j", 10), (JOIN, "", None)), ())
    assert check_race(after_join) == []
    unban = RaceOutcome("x", "!r", "@bob", "leave", ((("owner", "unban"), "", None),), (), start_by="owner")
    assert any("answered 200 but is not stored" in p for p in check_race(unban))


def test_a_refusal_of_a_change_allowed_wherever_it_was_checked_is_caught() -> None:
    """A kick and a join from invite are allowed in either order: neither may be refused."""
    problems = check_race(_race("kick-vs-join", "invite", [(("owner", "kick"), 10)], (JOIN,)))
    assert any("the target's join refused although the rules allow it" in p for p in problems), problems
    assert check_race(_race("ban-vs-join", "leave", [(BAN, 10)], (JOIN,))) == []


@pytest.mark.parametrize("membership", [None, "join", "leave", "invite", "ban"])
def test_prepare_reaches_every_pairs_start_with_allowed_changes(membership: str | None) -> None:
    for pair in PAIRS:
        at = membership
        for move in prepare(membership, pair.start):
            assert allowed(at, move), (membership, pair.start, move)
            at = RESULT[move[1]]
        assert at == pair.start
        assert allowed(pair.start, pair.mine) or allowed(pair.start, pair.owners)


def test_a_refused_change_that_was_stored_is_caught() -> None:
    race = _race("ban-vs-join", "leave", [(BAN, 10)], (JOIN,))
    problems = check_race(RaceOutcome(race.pair, race.room_id, race.target, race.start, race.accepted,
                                      race.refused, (JOIN,)))  # fmt: skip
    assert any("the target's join answered 403 but is stored" in p for p in problems), problems


def test_a_change_neither_side_sent_leaves_the_race_unjudged() -> None:
    """A kick a client gave up on during a fault, landing during the race, would make the race's
    leave look refused from join: such a race is left out; the race's own changes are not foreign."""
    leave = ("me", "leave")
    assert foreign([("owner", "kick")], [], [leave, INVITE])
    assert foreign([leave, leave], [leave], [])
    assert not foreign([leave, INVITE], [leave, INVITE], [])
    assert not foreign([INVITE], [], [INVITE])  # refused but stored: judged (and caught) as before
