"""The load's membership churn: which moves a user, or the room's owner on them, may make from each
membership, in the rooms the load makes.

The load's knock room has the join rule `knock_restricted`, allowing the first of the load's rooms:
everyone may knock on it, its invitees join it, and so do members of the allowed room, vouched for
by the owner (a restricted join). No other room takes knocks. A release before restricted joins
refuses that join rule (the upgrade check starts on one): the knock room is then a plain `knock`
room, which only its invitees join.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Churn's moves from each membership: (who acts, what), "me" being the churning user. No re-invite:
#: the owner's invite repeated is answered with the first and stores nothing (as in Synapse).
CHURN_MOVES: dict[str | None, list[tuple[str, str]]] = {
    None: [("owner", "invite"), ("me", "join"), ("me", "knock")],
    "leave": [("owner", "invite"), ("me", "join"), ("me", "knock"), ("owner", "ban")],
    "invite": [("me", "join"), ("me", "join"), ("me", "leave"), ("owner", "kick")],
    "knock": [("owner", "invite"), ("owner", "invite"), ("owner", "kick"), ("me", "leave")],
    "join": [("me", "leave"), ("owner", "kick"), ("owner", "ban")],
    "ban": [("owner", "unban")],
}


def moves(state: str | None, knock_room: bool, vouched: bool) -> list[tuple[str, str]]:
    """The moves from `state`: a knock only in the knock room; a join there only from an invite,
    or `vouched` (the user is a member of the room it allows)."""
    may_join = not knock_room or state == "invite" or vouched
    return [
        (who, what)
        for who, what in CHURN_MOVES[state]
        if (what != "join" or may_join) and (what != "knock" or knock_room)
    ]


def knock_room_rules(allowing: Sequence[str]) -> list[dict[str, Any]]:
    """The join rules to try for the knock room, in order (the first a cluster takes)."""
    allow = [{"type": "m.room_membership", "room_id": room} for room in allowing]
    return [{"join_rule": "knock_restricted", "allow": allow}, {"join_rule": "knock"}]
