"""The checks of a room write that read stored events, beside the room's rules (`rules.check`,
which reads only the cached views).

Run by `RoomWrites` on the room's writer, inside the write's admission, so what they read is what
the writes admitted before this one left (an equal membership change, or an equal reaction, waits
for the first to be stored):
* a repeat: a membership change that repeats the target's member event is answered with it and
  stores nothing, as Synapse answers (`repeated`);
* a /kick or an /unban whose target is not as the request expects (`off_target`);
* after the rules: a redaction's target, a relation's parent and earlier annotations
  (`relations`), the aliases a canonical alias event adds (`canonical_alias`); createRoom's events
  likewise, against the plan (`planned`).
"""

from __future__ import annotations

from typing import Any

import asyncpg

from workers.handlers.rooms import canonical_alias, relations
from workers.handlers.rooms import rules as rooms
from workers.handlers.rooms.known_content import SERVER_ACL_EVENT
from workers.handlers.rooms.versions import REDACTION_EVENT
from workers.model import CREATE_EVENT, MEMBER_EVENT, Event, NewEvent
from workers.storage import events as store

#: Event types a redaction may not name (Synapse refuses them too).
UNREDACTABLE = frozenset({CREATE_EVENT, SERVER_ACL_EVENT})


class StoredChecks:
    """The checks above, over the writer's pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def stored(self, event_id: str) -> Event | None:
        async with self._pool.acquire() as conn:
            return (await store.events_by_ids(conn, [event_id])).get(event_id)

    async def repeated(self, event: NewEvent, view: rooms.RoomView) -> Event | None:
        """The target's current member event when `event` repeats it (same sender, membership and
        content), else None; read only when the memberships match. Synapse answers such a request
        with the stored event and writes nothing, before the rules: a client's retried /join,
        /leave, /invite, /kick or /ban is one event. Run inside the target's admission claim, so
        two racing repeats see each other's event."""
        if event.type != MEMBER_EVENT or event.state_key is None:
            return None
        if view.target_membership != event.membership:
            return None
        async with self._pool.acquire() as conn:
            current = await store.current_state_event(conn, event.room_id, MEMBER_EVENT, event.state_key)
        if current is None or current.sender != event.sender or current.content != event.content:
            return None
        return current

    async def after_rules(self, event: NewEvent, view: rooms.RoomView) -> None:
        """After the rules, the checks that read stored events (none for a plain message): a
        redaction's target, a relation's parent and earlier annotations, the aliases a canonical
        alias event adds to the room's current one."""
        if event.type == REDACTION_EVENT:
            await self._check_redaction(event, view)
        if relations.RELATES_TO in event.content:
            async with self._pool.acquire() as conn:
                await relations.check(conn, event)
        if canonical_alias.is_canonical_alias(event):
            async with self._pool.acquire() as conn:
                now = await store.current_state_event(conn, event.room_id, event.type, "")
                await canonical_alias.check(conn, event, None if now is None else now.content)

    async def planned(self, events: list[NewEvent]) -> None:
        """`after_rules` for createRoom's events: a relation's parent (never one of the new room's),
        each canonical alias event against the one before it in the plan."""
        if not any(
            canonical_alias.is_canonical_alias(e) or relations.RELATES_TO in e.content for e in events
        ):
            return
        current: dict[str, Any] | None = None
        async with self._pool.acquire() as conn:
            for event in events:
                await relations.check(conn, event)
                if canonical_alias.is_canonical_alias(event):
                    await canonical_alias.check(conn, event, current)
                    current = event.content

    async def _check_redaction(self, event: NewEvent, view: rooms.RoomView) -> None:
        """A redaction names an event id in `content.redacts`; another sender's event (or one not
        stored) takes the room's `redact` level. As in Synapse, an event of another room is 400, and
        the room's create event (its version and creator) and server ACLs are never redacted (403)."""
        redacts = event.content.get("redacts")
        if not isinstance(redacts, str):
            raise rooms.BadEvent("a redaction names the event it redacts in content.redacts")
        target = await self.stored(redacts)
        if target is not None and target.room_id != event.room_id:
            raise rooms.BadEvent(f"{redacts} is an event of another room")
        if target is not None and target.type in UNREDACTABLE:
            raise rooms.Forbidden(f"redacting {target.type} is not permitted")
        refusal = view.power.may_redact(event.sender, None if target is None else target.sender)
        if refusal is not None:
            raise rooms.Forbidden(refusal)


def off_target(
    event: NewEvent, target_was: frozenset[str] | None, view: rooms.RoomView
) -> rooms.Forbidden | None:
    """The refusal of a /kick of a user not in the room or an /unban of one not banned (403, as
    Synapse answers: M_BAD_STATE for an unban of a user with a membership and a kick of a banned
    one, M_FORBIDDEN for the rest), or None when the target is as the request expects."""
    if target_was is None or view.target_membership in target_was:
        return None
    unban = "ban" in target_was
    bad_state = view.target_membership is not None and (unban or view.target_membership == "ban")
    return (rooms.BadState if bad_state else rooms.Forbidden)(
        f"{event.state_key} is not {' or '.join(sorted(target_was))} in {event.room_id}"
        f" (membership {view.target_membership})"
    )
