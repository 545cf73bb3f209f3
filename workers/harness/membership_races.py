"""Racing membership changes to one user, sent at the same time through different workers, and
their check.

A race starts from a membership the load set and knows (the target's changes are serialized by
the load's per-user lock, so nothing else moves the target meanwhile), gets there first with
ordinary changes if needed, then sends a pair at once: the target's own change through one worker
and the room owner's change of the target through another, the second 0-4 ms after the first.
Each side is answered 200 (accepted, stored), 403 (refused by the room's rules) or neither (a
fault: the race is left out of the check and the target's membership becomes unknown).

`check_race` holds the Matrix rules (a public room, the owner at power 100 and the target at 0)
and judges what was stored, never a guessed order: the accepted changes, replayed from the starting
membership in their stored order, must each be allowed from the membership before it; every
accepted change must be stored, unless it repeats the target's membership event (the same actor's
same membership: answered with that event, as Synapse answers); a refused change must be one the
rules refuse from one of the two memberships it could have been checked against (the start, or
after the other side). The membership the load carries on with is the replay's end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: A membership change: who acts ("me": the target itself; "owner": the room's creator) and what.
Move = tuple[str, str]

#: The membership each change leaves the target in.
RESULT = {
    "join": "join",
    "leave": "leave",
    "invite": "invite",
    "kick": "leave",
    "ban": "ban",
    "unban": "leave",
}
#: The changes `prepare` may use to reach a race's starting membership.
PREPARE_MOVES: tuple[Move, ...] = (
    ("me", "join"), ("me", "leave"), ("owner", "invite"), ("owner", "kick"), ("owner", "ban"),
    ("owner", "unban"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RacePair:
    """Two changes to one target that race: `mine` by the target, `owners` by the room's owner,
    both from the membership `start`."""

    name: str
    start: str
    mine: Move
    owners: Move


PAIRS: tuple[RacePair, ...] = (
    # join first: the invite of a joined user must be refused; invite first: both stand.
    RacePair("join-vs-invite", "invite", ("me", "join"), ("owner", "invite")),
    # leave first: both stand (a re-invite); invite first: the invite of a joined user is refused.
    RacePair("leave-vs-invite", "join", ("me", "leave"), ("owner", "invite")),
    # either order stands: a kicked user rejoins a public room, a joined user can be kicked.
    RacePair("kick-vs-join", "invite", ("owner", "kick"), ("me", "join")),
    # ban first: the join must be refused; join first: both stand.
    RacePair("ban-vs-join", "leave", ("owner", "ban"), ("me", "join")),
)


def allowed(membership: str | None, move: Move) -> bool:
    """Whether the Matrix rules let `move` happen to a target whose membership is `membership`,
    in a public room whose owner has power 100 and the target 0, through the client API (the owner
    may kick only a member, an invitee or a knocker, and unban only a banned user)."""
    who, what = move
    if who == "me":
        if what == "join":
            return membership != "ban"
        return what == "leave" and membership in ("invite", "join", "knock")
    if what == "invite":
        return membership not in ("join", "ban")
    if what == "kick":
        return membership in ("join", "invite", "knock")
    if what == "unban":
        return membership == "ban"
    return what == "ban"


def prepare(membership: str | None, start: str) -> list[Move]:
    """The fewest changes, each allowed, that take the target from `membership` to `start`."""
    paths: dict[str | None, list[Move]] = {membership: []}
    frontier: list[str | None] = [membership]
    while frontier and start not in paths:
        following: list[str | None] = []
        for at in frontier:
            for move in PREPARE_MOVES:
                after = RESULT[move[1]]
                if allowed(at, move) and after not in paths:
                    paths[after] = [*paths[at], move]
                    following.append(after)
        frontier = following
    return paths[start]


@dataclass(frozen=True, slots=True)
class RaceOutcome:
    """One race as answered and stored. `accepted`: (move, its event's id and stream ordering,
    or "" and None when no such event is stored); `refused`: the moves answered 403."""

    pair: str
    room_id: str
    target: str
    start: str
    accepted: tuple[tuple[Move, str, int | None], ...]
    refused: tuple[Move, ...]
    #: Refused changes found stored all the same.
    refused_but_stored: tuple[Move, ...] = ()
    #: Who made the starting membership ("me", "owner"; None: unknown or nobody).
    start_by: str | None = None

    def stored_order(self) -> list[Move]:
        """The accepted changes that were stored, in the room's stored order."""
        stored = sorted((o, m) for m, _, o in self.accepted if o is not None)
        return [m for _, m in stored]

    def repeated(self, move: Move) -> bool:
        """Whether `move` may have been a repeat of the target's membership event when checked (the
        same actor's same membership, at the start or after the other side): answered 200 with
        that event, nothing stored, as Synapse answers (an unban never: it needs a ban)."""
        places = [(self.start, self.start_by), *((RESULT[what], who) for who, what in self.stored_order())]
        return move[1] != "unban" and (RESULT[move[1]], move[0]) in places

    def final(self) -> str:
        """The target's membership after the race, replayed from what was stored."""
        membership = self.start
        for move in self.stored_order():
            membership = RESULT[move[1]]
        return membership


def check_race(outcome: RaceOutcome) -> list[str]:
    """Every way the race's stored result breaks the rules (empty: it is one they allow)."""
    where = f"race {outcome.pair} on {outcome.target} in {outcome.room_id}"
    problems: list[str] = []
    for move, _event_id, ordering in outcome.accepted:
        if ordering is None and not outcome.repeated(move):
            problems.append(f"{where}: {_name(move)} answered 200 but is not stored")
    for move in outcome.refused_but_stored:
        problems.append(f"{where}: {_name(move)} answered 403 but is stored")
    membership = outcome.start
    order = outcome.stored_order()
    for move in order:
        if not allowed(membership, move):
            problems.append(
                f"{where}: {_name(move)} accepted and stored after {' then '.join(map(_name, order))}"
                f" although the rules refuse it from {membership}"
            )
        membership = RESULT[move[1]]
    for move in outcome.refused:
        places = [outcome.start, *(RESULT[m[1]] for m in order)]
        if all(allowed(at, move) for at in places):
            problems.append(
                f"{where}: {_name(move)} refused although the rules allow it from {' and '.join(places)}"
            )
    return problems


def foreign(stored: Sequence[Move], accepted: Sequence[Move], refused: Sequence[Move]) -> bool:
    """Whether the changes stored since the race's start hold one neither side sent (or one twice):
    a request a client gave up on in a fault (its timeout passed while a worker still held it)
    that landed during the race. Such a race cannot be judged: it is left out, as after a fault."""
    return len(set(stored)) < len(stored) or bool(set(stored) - set(accepted) - set(refused))


def check_races(outcomes: Iterable[RaceOutcome]) -> list[str]:
    return [p for outcome in outcomes for p in check_race(outcome)]


@dataclass
class RaceTally:
    """The races' outcomes, for the summary."""

    sent: int = 0
    both_accepted: int = 0
    one_refused: int = 0
    both_refused: int = 0
    unknown: int = 0

    def count(self, accepted: Sequence[object], refused: Sequence[object]) -> None:
        self.sent += 1
        if len(accepted) == 2:
            self.both_accepted += 1
        elif len(refused) == 2:
            self.both_refused += 1
        else:
            self.one_refused += 1


def _name(move: Move) -> str:
    who, what = move
    return f"{'the target' if who == 'me' else 'the owner'}'s {what}"
