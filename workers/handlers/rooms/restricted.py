"""Restricted joins: who vouches for a user joining a room whose join rule is `restricted` or
`knock_restricted` (rooms 8 and later; spaces use them).

Such a room lets in, besides its invitees, any user joined to one of the rooms its join rule's
`allow` names (`{"type": "m.room_membership", "room_id": ...}`). The room's rules cannot see other
rooms, so the join carries `join_authorised_via_users_server`: a member of the room at the invite
level who vouches for it, as if they had invited the user; the rules (and any server replaying the
room) check only that this member is joined and may invite (`rules._authorised`). Choosing that
member, and checking the user's membership in the allowed rooms, is this server's part, done here
when a client joins, as Synapse does:

* the user is invited or joined already, or the room is not restricted: nothing to add;
* the user is in none of the allowed rooms: 403 `M_FORBIDDEN` (400 `M_UNABLE_TO_AUTHORISE_JOIN`
  when `allow` also names conditions of a kind this server does not know);
* no local member of the room may invite: 400 `M_UNABLE_TO_GRANT_JOIN`.

The member chosen is the joined local member with the highest power level at or above the invite
level (ties by user id), so a join names the room's admin rather than whoever came first. The room
may change between this choice and the join's check on the room's writer (the member leaves, or
is demoted): the writer then refuses the join (403), checked in the room's order with the member's
membership held (`writes.claim_of`), and the client may try again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.handlers.rooms.rules import JOIN_RULES_EVENT, RESTRICTED, BadEvent, Forbidden, load_room
from workers.storage import Conn
from workers.storage import events as store

#: The one kind of `allow` condition the spec defines: membership of another room.
ROOM_MEMBERSHIP = "m.room_membership"


class UnableToAuthoriseJoin(BadEvent):
    """The join rule names conditions this server cannot check (400, as Synapse answers)."""

    errcode = "M_UNABLE_TO_AUTHORISE_JOIN"


class UnableToGrantJoin(BadEvent):
    """No local member of the room may invite, so none can vouch for the join (400, as Synapse
    answers)."""

    errcode = "M_UNABLE_TO_GRANT_JOIN"


def allowed_rooms(join_rules: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The rooms a restricted join rule's `allow` names, and whether it names conditions of
    another kind (or malformed ones)."""
    allow = join_rules.get("allow")
    rooms: list[str] = []
    unknown = False
    for condition in allow if isinstance(allow, list) else ():
        if (
            isinstance(condition, dict)
            and condition.get("type") == ROOM_MEMBERSHIP
            and isinstance(condition.get("room_id"), str)
        ):
            rooms.append(condition["room_id"])
        else:
            unknown = True
    return rooms, unknown


async def authoriser(conn: Conn, room_id: str, user_id: str) -> str | None:
    """The member who vouches for `user_id` joining `room_id`, or None when the join needs none
    (see the module docstring). Raises Forbidden, UnableToAuthoriseJoin or UnableToGrantJoin. One
    statement for a room that is not restricted."""
    join_rules = await store.current_state_event(conn, room_id, JOIN_RULES_EVENT, "")
    if join_rules is None or join_rules.content.get("join_rule") not in RESTRICTED:
        return None
    if await store.membership(conn, user_id, room_id) in ("invite", "join"):
        return None
    rooms, unknown = allowed_rooms(join_rules.content)
    if not set(rooms) & set(await store.joined_rooms(conn, user_id)):
        if unknown:
            raise UnableToAuthoriseJoin(f"{room_id}'s join rule names conditions this server cannot check")
        raise Forbidden(f"{user_id} is in none of the rooms {room_id}'s join rule allows")
    power = (await load_room(conn, room_id)).power
    able = [u for u in await store.joined_members(conn, room_id) if power.user(u) >= power.top["invite"]]
    if not able:
        raise UnableToGrantJoin(f"no member of {room_id} on this server may invite")
    return min(able, key=lambda u: (-power.user(u), u))
