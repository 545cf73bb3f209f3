"""Who may see which event of a room: the spec's history visibility rules, in one place.

Pure functions over two histories, each a tuple of (stream ordering, value) in stream order: the
user's own membership changes in the room and the room's `m.room.history_visibility` changes. Every
read path (sync, `/messages`, `/event`, the initial sync) asks `may_see`.

The rules (the spec's "history visibility" algorithm), for an event E:
* the user's own member event: always (Synapse does the same);
* the user's membership just after E is `join`: yes;
* the visibility in force at E is `world_readable`: yes;
* it is `shared` and the user joined at some point after E (`joined_after`): yes;
* it is `invited` and the user's membership at E is `invite`: yes;
* otherwise no.
For the `m.room.history_visibility` event itself the more permissive of the values before and after
it counts, as in Synapse. A room with no visibility event is `shared`, the spec's default.

A sync window (`joined_by` given) delivers a room's events to its members only: an event the user
was not joined at is delivered when the user joins later inside the same window and one of the
rules above lets it see the event (`world_readable` counting as `shared`). Otherwise a room the
user is not in would be listed under `join`; the earlier history of a room joined in a window is
read with /messages from the timeline's `prev_batch` (the timeline says `limited`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

from workers.model import MEMBER_EVENT, VISIBILITY_EVENT

WORLD_READABLE = "world_readable"
SHARED = "shared"
INVITED = "invited"
JOINED = "joined"
#: From most to least permissive; an unknown value counts as `joined` (the least).
ORDER = (WORLD_READABLE, SHARED, INVITED, JOINED)
DEFAULT = SHARED

#: (stream ordering, value) in stream order.
Changes = Sequence[tuple[int, str]]


def value_at(changes: Changes, ordering: int, default: str | None = None) -> str | None:
    """The value in force just after the event at `ordering` (`default` before the first change)."""
    index = bisect.bisect_right(changes, (ordering, "\uffff")) - 1
    return changes[index][1] if index >= 0 else default


def visibility_at(visibility: Changes, ordering: int, *, is_change: bool = False) -> str:
    """The history visibility in force at the event at `ordering`; for a visibility event itself
    (`is_change`), the more permissive of the values before and after it."""
    after = _known(value_at(visibility, ordering, DEFAULT))
    if not is_change:
        return after
    before = _known(value_at(visibility, ordering - 1, DEFAULT))
    return min(before, after, key=ORDER.index)


def _known(value: str | None) -> str:
    return value if value in ORDER else JOINED


def joined_after(membership: Changes, ordering: int, upto: int | None = None) -> bool:
    """Whether the user joined after `ordering` (and at or before `upto`, when given)."""
    start = bisect.bisect_right(membership, (ordering, "\uffff"))
    for position, value in membership[start:]:
        if upto is not None and position > upto:
            return False
        if value == "join":
            return True
    return False


def may_see(
    ordering: int,
    own_member_event: bool,
    membership: Changes,
    visibility: Changes,
    *,
    is_change: bool = False,
    joined_by: int | None = None,
) -> bool:
    """Whether the user may see the event at `ordering` (see the module docstring). With
    `joined_by` the question is a sync window's, which ends at `joined_by` in the event's room."""
    if own_member_event:
        return True
    at = value_at(membership, ordering)
    if at == "join":
        return True
    rule = visibility_at(visibility, ordering, is_change=is_change)
    if joined_by is not None:
        allowed = rule in (WORLD_READABLE, SHARED) or (rule == INVITED and at == "invite")
        return allowed and joined_after(membership, ordering, joined_by)
    if rule == WORLD_READABLE:
        return True
    if rule == SHARED:
        return joined_after(membership, ordering)
    return rule == INVITED and at == "invite"


class Placed(Protocol):
    """What the rules need of an event (an Event or an index entry of one)."""

    @property
    def stream_ordering(self) -> int: ...
    @property
    def type(self) -> str: ...
    @property
    def state_key(self) -> str | None: ...


def may_see_event(
    event: Placed, user_id: str, membership: Changes, visibility: Changes, joined_by: int | None = None
) -> bool:
    """`may_see` for `event`. Backfilled history (a negative ordering: the room's past, older than
    every live event) is shown to current members, and to anyone in a `world_readable` room."""
    if event.stream_ordering < 0:
        joined_now = bool(membership) and membership[-1][1] == "join"
        return joined_now or current(visibility) == WORLD_READABLE
    return may_see(
        event.stream_ordering,
        event.type == MEMBER_EVENT and event.state_key == user_id,
        membership,
        visibility,
        is_change=event.type == VISIBILITY_EVENT,
        joined_by=joined_by,
    )


def current(visibility: Changes) -> str:
    """The room's history visibility now."""
    return _known(visibility[-1][1]) if visibility else DEFAULT


def all_permissive(visibility: Changes) -> bool:
    """Whether the room's history was never narrower than `shared` (a member sees all of it)."""
    return all(_known(v) in (WORLD_READABLE, SHARED) for _, v in visibility)
