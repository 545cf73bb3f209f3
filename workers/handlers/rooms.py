"""Who may send what into a room: plain rules over the room's current state.

These checks run on the persister before an event is queued. They read committed state, so two
persisters racing on one room could both accept conflicting membership changes; the stored
state then follows stream order (the higher ordering wins), which every reader sees alike.

The state they read is cached on the room's writer (`RoomViews`): a query per send was a third of
a persister's CPU under HTTP load, and a round trip per event is what batching is there to avoid.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg

from workers.errors import RoomRuleError
from workers.handlers.caches import EventLike, LruCache
from workers.model import MEMBER_EVENT, MEMBERSHIPS, NewEvent
from workers.storage import Conn

CREATE_EVENT = "m.room.create"
JOIN_RULES_EVENT = "m.room.join_rules"
JOIN_RULES = frozenset({"public", "invite"})


class Forbidden(RoomRuleError):
    """The sender may not do this (HTTP 403)."""


class NotFound(RoomRuleError):
    """No such room (HTTP 404)."""


class BadEvent(RoomRuleError):
    """The event is malformed (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class RoomView:
    """What the rules need to know of a room at the time of the check."""

    exists: bool
    join_rule: str
    sender_membership: str | None
    target_membership: str | None


async def load_room(conn: Conn, room_id: str) -> tuple[bool, str]:
    """(the room exists, its join rule) from current state."""
    records = await conn.fetch(
        "SELECT c.type, e.json FROM current_state_events c JOIN events e ON e.event_id = c.event_id"
        " WHERE c.room_id = $1 AND c.type IN ('m.room.create', 'm.room.join_rules')",
        room_id,
    )
    exists, join_rule = False, "invite"
    for r in records:
        if r["type"] == CREATE_EVENT:
            exists = True
        else:
            join_rule = json.loads(r["json"]).get("content", {}).get("join_rule", "invite")
    return exists, join_rule


async def load_membership(conn: Conn, room_id: str, user_id: str) -> str | None:
    """`user_id`'s membership in the room's current state (None: never a member)."""
    value = await conn.fetchval(
        "SELECT membership FROM current_state_events"
        " WHERE room_id = $1 AND type = 'm.room.member' AND state_key = $2",
        room_id,
        user_id,
    )
    return value if isinstance(value, str) else None


class RoomViews:
    """The current state the rules read, cached on the room's writer.

    Only a room's writer persists its events (rooms are routed by `writer_for_room`, and the API
    refuses the others), and the writer calls `on_events` after each batch commits, before its
    callers hear of it. So a view is never older than what this writer has acknowledged, as with a
    query per check; a load that overlaps an invalidation is not kept (see `LruCache`).
    """

    def __init__(self, pool: asyncpg.Pool, max_entries: int) -> None:
        self._pool = pool
        self.rooms: LruCache[str, tuple[bool, str]] = LruCache("room_rules", max_entries, self._room)
        self.memberships: LruCache[tuple[str, str], str | None] = LruCache(
            "room_memberships", max_entries, self._membership
        )

    async def view(self, room_id: str, sender: str, target: str | None) -> RoomView:
        exists, join_rule = await self.rooms.get(room_id)
        return RoomView(
            exists,
            join_rule,
            await self.memberships.get((room_id, sender)),
            None if target is None else await self.memberships.get((room_id, target)),
        )

    def on_events(self, events: Iterable[EventLike]) -> None:
        """Forget what committed `events` changed (call before their senders are answered)."""
        for event in events:
            if event.state_key is None:
                continue
            if event.type == MEMBER_EVENT:
                self.memberships.invalidate((event.room_id, event.state_key))
            elif event.type in (CREATE_EVENT, JOIN_RULES_EVENT):
                self.rooms.invalidate(event.room_id)

    async def _room(self, room_id: str) -> tuple[bool, str]:
        async with self._pool.acquire() as conn:
            return await load_room(conn, room_id)

    async def _membership(self, key: tuple[str, str]) -> str | None:
        async with self._pool.acquire() as conn:
            return await load_membership(conn, *key)


def check(event: NewEvent, view: RoomView) -> None:
    """Raise Forbidden/NotFound/BadEvent unless `event` may be sent into the room as `view` shows it."""
    if not view.exists:
        raise NotFound(f"no room {event.room_id}")
    if event.type != MEMBER_EVENT:
        if view.sender_membership != "join":
            raise Forbidden(f"{event.sender} is not in {event.room_id}")
        if event.type == JOIN_RULES_EVENT and event.content.get("join_rule") not in JOIN_RULES:
            raise BadEvent(f"join_rule must be one of {sorted(JOIN_RULES)}")
        return
    membership = event.membership
    if membership not in MEMBERSHIPS or event.state_key is None:
        raise BadEvent("a member event needs a state_key (the user) and content.membership")
    if membership == "join":
        if event.state_key != event.sender:
            raise Forbidden("only the user themself can join")
        if view.sender_membership == "ban":
            raise Forbidden(f"{event.sender} is banned from {event.room_id}")
        if view.join_rule != "public" and view.sender_membership not in ("invite", "join"):
            raise Forbidden(f"{event.room_id} is invite-only")
    elif membership == "leave":
        if event.state_key == event.sender:
            if view.sender_membership not in ("join", "invite"):
                raise Forbidden(f"{event.sender} is not in {event.room_id}")
        elif view.sender_membership != "join" or view.target_membership not in ("join", "invite"):
            raise Forbidden("kicking needs the sender joined and the target in the room")
    elif membership in ("invite", "ban"):
        if view.sender_membership != "join":
            raise Forbidden(f"{event.sender} is not in {event.room_id}")
        if membership == "invite" and view.target_membership in ("join", "ban"):
            raise Forbidden(f"{event.state_key} cannot be invited (membership {view.target_membership})")


def new_event_id() -> str:
    """128 random bits: unique, not secret (reading a room takes membership, not its ids). From
    `random` (seeded from the OS, reseeded after fork): a system call per event showed in write
    path profiles."""
    return "$" + random.getrandbits(128).to_bytes(16, "big").hex()  # half the time of f"{:032x}"


def new_room_id() -> str:
    return f"!{random.getrandbits(72):018x}"


def create_room_events(creator: str, join_rule: str, room_id: str | None = None) -> list[NewEvent]:
    """The events that make a room: create, the creator's join, the join rule."""
    if join_rule not in JOIN_RULES:
        raise BadEvent(f"join_rule must be one of {sorted(JOIN_RULES)}")
    room = room_id or new_room_id()
    content: dict[str, Any] = {"creator": creator}
    return [
        NewEvent(new_event_id(), room, CREATE_EVENT, creator, content, ""),
        NewEvent(new_event_id(), room, MEMBER_EVENT, creator, {"membership": "join"}, creator),
        NewEvent(new_event_id(), room, JOIN_RULES_EVENT, creator, {"join_rule": join_rule}, ""),
    ]
