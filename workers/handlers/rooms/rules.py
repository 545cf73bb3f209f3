"""Who may send what into a room: plain rules over the room's current state.

These checks run on the room's writer, one room's events in the room's order: an event that may
change what they read (a membership, the room's rules, a redaction) is checked once every event
admitted before it that reads or changes the same is stored, and holds what it changes until its
own batch committed and the cached views forgot it (`workers.handlers.rooms.admission`, as Synapse's
per-room `member_linearizer`); messages are checked together and still batch. Only the room's
lease holder writes it, so each event is checked against the state the room's previous accepted
event it depends on left.

The state they read is cached on the room's writer (`RoomViews`): a query per send was a third of
a persister's CPU under HTTP load, and a round trip per event is what batching is there to avoid.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pydantic_core

from workers import identifiers
from workers.errors import RoomRuleError
from workers.handlers.caches.lru import EventLike, LruCache
from workers.handlers.rooms import known_content
from workers.handlers.rooms.power_levels import PowerLevels, content_problem
from workers.model import (
    CREATE_EVENT,
    MEMBER_EVENT,
    MEMBERSHIPS,
    PRESENT,
    REDACTION_EVENT,
    SUPPORTED_ROOM_VERSIONS,
    Event,
    NewEvent,
)
from workers.redaction_rules import prune_content, rules_for
from workers.storage import Conn
from workers.storage import purge as purge_store
from workers.storage import rooms as room_store
from workers.storage.purge import BLOCKED_ROOM

JOIN_RULES_EVENT = "m.room.join_rules"
POWER_LEVELS_EVENT = "m.room.power_levels"
THIRD_PARTY_INVITE_EVENT = "m.room.third_party_invite"
#: The state events the rules read of a room (besides memberships).
RULE_EVENTS = frozenset({CREATE_EVENT, JOIN_RULES_EVENT, POWER_LEVELS_EVENT})
JOIN_RULES = frozenset({"public", "invite", "knock", "restricted", "knock_restricted"})
#: Join rules under which a user who is neither invited nor joined joins only on an authorising
#: member's word (`AUTHORISING_USER`), which this server gives when the user is in a room the join
#: rule's `allow` names (`workers.handlers.rooms.restricted`).
RESTRICTED = frozenset({"restricted", "knock_restricted"})


class Forbidden(RoomRuleError):
    """The sender may not do this (HTTP 403 with `errcode`)."""

    errcode = "M_FORBIDDEN"


class BadState(Forbidden):
    """A membership change the target's current membership rules out whoever asks, before any power
    level is weighed: a banned user joined, knocking, invited or kicked, an unban of a user who is
    not banned. 403 M_BAD_STATE, as Synapse's membership handler answers them."""

    errcode = "M_BAD_STATE"


class NotFound(RoomRuleError):
    """No such room (HTTP 404)."""


class BadEvent(RoomRuleError):
    """The event is malformed (HTTP 400 with `errcode`)."""

    errcode = "M_BAD_JSON"


class InvalidParam(BadEvent):
    """The request asks for an event the client API never writes (400 M_INVALID_PARAM)."""

    errcode = "M_INVALID_PARAM"


class TooLarge(RoomRuleError):
    """The event would be over the spec's size limit (HTTP 413)."""


#: The spec's limit on an event in the federation format (signatures, hashes, prev and auth events
#: included), as canonical JSON.
MAX_EVENT_BYTES = 65_536
#: What the federation format adds to an event's type, room, sender, state key and content: the
#: key names, hashes, signatures, depth, timestamp and a few prev and auth event ids (about 700
#: bytes in Synapse's events), rounded up so that no event stored here is over the limit there.
_PDU_OVERHEAD = 1_024


@dataclass(frozen=True, slots=True)
class RoomRules:
    """What the rules need of a room's own state: does it exist, its join rule, its power levels,
    and (for a room that lives on another server, known here by an invite) its version."""

    exists: bool
    join_rule: str
    power: PowerLevels
    remote_version: str | None = None
    #: An admin blocked the room id (`blocked_rooms`): no one may join, be invited or knock.
    blocked: bool = False


@dataclass(frozen=True, slots=True)
class RoomView:
    """What the rules need to know of a room at the time of the check."""

    exists: bool
    join_rule: str
    sender_membership: str | None
    target_membership: str | None
    power: PowerLevels = field(default_factory=PowerLevels)
    remote_version: str | None = None
    blocked: bool = False
    #: The membership of the user a join names as its authoriser (`AUTHORISING_USER`), if any.
    authoriser_membership: str | None = None


async def load_room(conn: Conn, room_id: str) -> RoomRules:
    """The room's rules from its current state."""
    records = await conn.fetch(
        "SELECT c.type, e.sender, e.json, r.room_version AS redacted_under FROM current_state_events c"
        " JOIN events e ON e.event_id = c.event_id LEFT JOIN redactions r ON r.redacts = c.event_id"
        " WHERE c.room_id = $1 AND c.type IN ('m.room.create', 'm.room.join_rules', 'm.room.power_levels')",
        room_id,
    )
    exists, join_rule, creator, power = False, "invite", None, None
    blocked = await purge_store.is_blocked(conn, room_id)
    for r in records:
        content = json.loads(r["json"]).get("content", {})
        if r["redacted_under"] is not None:  # a redacted rule counts as what its pruning leaves
            content = prune_content(r["type"], content, rules_for(r["redacted_under"]))
        if r["type"] == CREATE_EVENT:
            exists, creator = True, content.get("creator", r["sender"])
        elif r["type"] == JOIN_RULES_EVENT:
            join_rule = content.get("join_rule", "invite")
        else:
            power = content if isinstance(content, dict) else {}
    if not exists:
        # A room on another server that invited a local user: joinable by the invitee (the local
        # stand-in for federation's join), under the version the invite named.
        remote = await room_store.remote_room(conn, room_id)
        if remote is not None:
            return RoomRules(True, "invite", PowerLevels.from_state(None, None), remote, blocked)
    return RoomRules(
        exists, join_rule, PowerLevels.from_state(power, creator if isinstance(creator, str) else None),
        blocked=blocked,
    )  # fmt: skip


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
        self.rooms: LruCache[str, RoomRules] = LruCache("room_rules", max_entries, self._room)
        self.memberships: LruCache[tuple[str, str], str | None] = LruCache(
            "room_memberships", max_entries, self._membership
        )

    async def view(
        self, room_id: str, sender: str, target: str | None, authoriser: str | None = None
    ) -> RoomView:
        room = await self.rooms.get(room_id)
        return RoomView(
            room.exists,
            room.join_rule,
            await self.memberships.get((room_id, sender)),
            None if target is None else await self.memberships.get((room_id, target)),
            room.power,
            room.remote_version,
            room.blocked,
            None if authoriser is None else await self.memberships.get((room_id, authoriser)),
        )

    def forget_room(self, room_id: str) -> None:
        """The room ended (purged, blocked or left by every local user): forget all of it."""
        self.rooms.invalidate(room_id)
        self.memberships.invalidate_matching(lambda key: key[0] == room_id)

    def on_committed(self, events: Sequence[Event]) -> None:
        """What this writer's batch `events` changed, known as it committed (call before their
        senders are answered): a live member event's membership is stored as the room's current
        one, since a membership change holds its target's membership from its check until this
        point (`workers.handlers.rooms.admission`), so nothing else changes it meanwhile; the
        rest is forgotten (`on_events`). Storing it saves the next write's check a read."""
        self.on_events(events)
        for event in events:
            if event.type == MEMBER_EVENT and event.state_key is not None and event.stream_ordering > 0:
                self.memberships.put((event.room_id, event.state_key), event.membership)

    def on_events(self, events: Iterable[EventLike]) -> None:
        """Forget what committed `events` changed (call before their senders are answered)."""
        for event in events:
            if event.type == REDACTION_EVENT:  # it may prune the room's power levels or join rule
                self.rooms.invalidate(event.room_id)
            if event.state_key is None:
                continue
            if event.type == MEMBER_EVENT:
                self.memberships.invalidate((event.room_id, event.state_key))
            elif event.type in RULE_EVENTS:
                self.rooms.invalidate(event.room_id)

    async def _room(self, room_id: str) -> RoomRules:
        async with self._pool.acquire() as conn:
            return await load_room(conn, room_id)

    async def _membership(self, key: tuple[str, str]) -> str | None:
        async with self._pool.acquire() as conn:
            return await load_membership(conn, *key)


def check(event: NewEvent, view: RoomView) -> None:
    """Raise Forbidden/NotFound/BadEvent unless `event` may be sent into the room as `view` shows it:
    the membership rules, then the room's power levels (`workers.handlers.rooms.power_levels`)."""
    if view.blocked and event.type == MEMBER_EVENT and event.membership not in ("leave", "ban"):
        raise Forbidden(BLOCKED_ROOM)
    if not view.exists:
        raise NotFound(f"no room {event.room_id}")
    well_formed(event)
    power = view.power
    if event.type != MEMBER_EVENT:
        if view.sender_membership != "join":
            raise Forbidden(f"{event.sender} is not in {event.room_id}")
        _allowed(power.may_send(event.sender, event.type, event.state_key is not None))
        if event.type == CALL_INVITE_EVENT and view.join_rule == "public":
            raise Forbidden("call invites are not allowed in public rooms")  # anyone could ring everyone
        if (
            event.state_key is not None
            and event.state_key.startswith("@")
            and event.state_key != event.sender
        ):
            raise Forbidden("a state key that is a user id must be the sender's own")
        if event.type == POWER_LEVELS_EVENT:
            _allowed(power.may_change_to(event.sender, event.content))
        return
    membership, target = event.membership, event.state_key or ""  # well_formed: a user id
    if membership == "join":
        if target != event.sender:
            raise Forbidden("only the user themself can join")
        if view.remote_version is not None and view.remote_version not in SUPPORTED_ROOM_VERSIONS:
            raise UnsupportedRoomVersion(f"{event.room_id} is of room version {view.remote_version}")
        if view.sender_membership == "ban":
            raise BadState(f"{event.sender} is banned from {event.room_id}")
        if view.join_rule in RESTRICTED and view.sender_membership not in ("invite", "join"):
            _authorised(event, view)
        elif view.join_rule != "public" and view.sender_membership not in ("invite", "join"):
            raise Forbidden(f"{event.room_id} is invite-only")
    elif membership == "knock":
        if target != event.sender:
            raise Forbidden("only the user themself can knock")
        if view.join_rule not in ("knock", "knock_restricted"):
            raise Forbidden(f"{event.room_id} does not take knocks")
        if view.sender_membership == "ban":
            raise BadState(f"{event.sender} is banned from {event.room_id}")
        if view.sender_membership in ("invite", "join"):
            raise Forbidden(f"{event.sender} cannot knock (membership {view.sender_membership})")
    elif membership == "leave" and target == event.sender:
        if view.sender_membership not in PRESENT:
            raise Forbidden(f"{event.sender} is not in {event.room_id}")
    else:  # invite, kick (leave of another), ban, unban (leave of a banned user)
        if membership == "invite" and view.target_membership == "ban":
            raise BadState(f"{target} is banned from {event.room_id}")
        if view.sender_membership != "join":
            raise Forbidden(f"{event.sender} is not in {event.room_id}")
        if membership == "invite":
            if view.target_membership == "join":
                raise Forbidden(f"{target} cannot be invited (membership join)")
            _allowed(power.may_act_on("invite", event.sender, target))
        elif membership == "ban":
            _allowed(power.may_act_on("ban", event.sender, target))
        elif view.target_membership == "ban":  # unban: the ban and the kick level, as the spec says
            _allowed(power.may_act_on("ban", event.sender, target))
            _allowed(power.may_act_on("kick", event.sender, target))
        elif view.target_membership in PRESENT:
            _allowed(power.may_act_on("kick", event.sender, target))
        else:
            raise Forbidden(f"{target} is not in {event.room_id}")


def authoriser_of(event: NewEvent) -> str | None:
    """The user a member event names as its authorising user (a string: `well_formed` refuses
    anything else), or None."""
    authoriser = event.content.get(AUTHORISING_USER) if event.type == MEMBER_EVENT else None
    return authoriser if isinstance(authoriser, str) else None


def _authorised(event: NewEvent, view: RoomView) -> None:
    """The join rules' restricted join (rule 4.3.5 of rooms 8 and later): the join names an
    authorising user who is a joined member at the invite level."""
    authoriser = authoriser_of(event)
    if authoriser is None:
        raise Forbidden(f"{event.room_id} is restricted: join through a room its join rule allows")
    if view.authoriser_membership != "join":
        raise Forbidden(f"{AUTHORISING_USER} {authoriser} is not in {event.room_id}")
    _allowed(view.power.may_act_on("invite", authoriser, event.sender))


def fits(event: NewEvent) -> None:
    """Raise TooLarge/BadEvent unless `event` is within the spec's size limit and its content is
    canonical JSON: what every event needs, a room's create event too (`well_formed` starts here)."""
    size = (
        len(pydantic_core.to_json(event.content))
        + _PDU_OVERHEAD
        + sum(len(text.encode()) for text in (event.room_id, event.sender, event.type, event.state_key or ""))
    )
    if size > MAX_EVENT_BYTES:
        raise TooLarge(f"the event would be about {size} bytes, over the limit of {MAX_EVENT_BYTES}")
    if (problem := _not_canonical(event.content)) is not None:
        raise BadEvent(f"{problem}: rooms 10 and 11 take canonical JSON only")


def well_formed(event: NewEvent) -> None:
    """Raise TooLarge/Forbidden/BadEvent for what no room state can allow: an event over the size
    limit, content that is not canonical JSON (floats, integers out of range), a create event after
    the first, a third-party invite (not served here), a join rule not served, power levels that are
    not integers or under another key, a member event without a membership or a user id as its
    state key, or naming an authorising user of another server, or content of a type the server
    reads that is not of its form (`known_content`: a server ACL denying this server, mentions).
    createRoom's events pass here too, before any of the room is written (`plan_room`)."""
    fits(event)
    if (
        problem := known_content.problem(event.type, event.content, event.state_key, event.sender)
    ) is not None:
        raise BadEvent(problem)
    if event.type == CREATE_EVENT:  # only createRoom writes it, first (rule 1: no prev_events)
        raise InvalidParam("m.room.create is a room's first event, written by createRoom only")
    if event.type == THIRD_PARTY_INVITE_EVENT or (
        event.type == MEMBER_EVENT and "third_party_invite" in event.content
    ):
        raise Forbidden("third-party invites are not served here")  # they need an identity server's token
    if event.type == JOIN_RULES_EVENT:
        if not one_of(event.content.get("join_rule"), JOIN_RULES):
            raise BadEvent(f"join_rule must be one of {sorted(JOIN_RULES)}")
        allow = event.content.get("allow")
        if allow is not None and not (isinstance(allow, list) and all(isinstance(a, dict) for a in allow)):
            raise BadEvent("join_rules' allow is a list of conditions (objects)")
    if event.type == POWER_LEVELS_EVENT:
        if event.state_key != "":
            raise BadEvent("m.room.power_levels takes the empty state key")
        if (problem := content_problem(event.content)) is not None:
            raise BadEvent(problem)
    if event.type == MEMBER_EVENT:
        if event.membership not in MEMBERSHIPS or event.state_key is None:
            raise BadEvent("a member event needs a state_key (the user) and content.membership")
        try:
            identifiers.check_user_id(event.state_key)
        except ValueError as e:
            raise BadEvent(f"a member event's state_key is a user id: {e}") from None
        if AUTHORISING_USER in event.content:  # never from a client: the API drops it
            _authoriser_signs(event)
        for key, limit in PROFILE_LIMITS.items():
            value = event.content.get(key)
            if isinstance(value, str) and len(value) > limit:
                raise BadEvent(f"a member event's {key} is at most {limit} characters")


#: A VoIP call's invite: Synapse refuses it in a public room (403), and so does this server.
CALL_INVITE_EVENT = "m.call.invite"

#: The longest display name and avatar URL a member event takes (characters), as in Synapse.
PROFILE_LIMITS = {"displayname": 256, "avatar_url": 1000}

#: A member event's content key naming the user whose server vouched for a restricted join.
AUTHORISING_USER = "join_authorised_via_users_server"


def _authoriser_signs(event: NewEvent) -> None:
    """Rule 4.2 of rooms 8 and later: an event naming an authorising user must be signed by that
    user's server. This server signs its users' events and no other server signs them, so the user
    must be one of the sender's server (Synapse refuses the same join, 403)."""
    authoriser = event.content[AUTHORISING_USER]
    try:
        identifiers.check_user_id(authoriser if isinstance(authoriser, str) else "")
    except ValueError:
        raise BadEvent(f"{AUTHORISING_USER} is a user id") from None
    if authoriser.partition(":")[2] != event.sender.partition(":")[2]:
        raise Forbidden(f"{AUTHORISING_USER} names a user of another server, which did not sign the event")


#: Canonical JSON's integers (room versions 6 and later): those an IEEE double holds exactly.
_CANONICAL_INT = 2**53 - 1


def _not_canonical(value: Any) -> str | None:
    """What in an event's content canonical JSON cannot hold (a float, an integer beyond ±(2**53 - 1)),
    or None. The spec has the client API answer such an event 400 M_BAD_JSON, as Synapse does."""
    if isinstance(value, dict):
        return next((p for v in value.values() if (p := _not_canonical(v)) is not None), None)
    if isinstance(value, list):
        return next((p for v in value if (p := _not_canonical(v)) is not None), None)
    if isinstance(value, float):
        return f"a number with a fraction or an exponent ({value!r})"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _CANONICAL_INT:
        return f"an integer out of range ({value})"
    return None


def one_of(value: Any, allowed: Iterable[str]) -> bool:
    """`value in allowed` for a client's value, which may be any JSON (a list is unhashable)."""
    return isinstance(value, str) and value in allowed


def _allowed(refusal: str | None) -> None:
    if refusal is not None:
        raise Forbidden(refusal)


def new_event_id() -> str:
    """128 random bits: unique, not secret (reading a room takes membership, not its ids). From
    `identifiers.random_bits` (seeded from the OS, reseeded after fork): a system call per event
    showed in write path profiles."""
    return "$" + identifiers.random_bits(128).to_bytes(16, "big").hex()  # half the time of f"{:032x}"


def txn_event_id(room_id: str, sender: str, device_id: str | None, txn_id: str) -> str:
    """The event id of a send with a client transaction id: a hash of (room, sender, device, txn).

    The same request retried gets the same id, and `events.event_id` is unique, so a retry can
    never persist a second event, whatever happened to the persister in between (the persister
    answers a retry whose event exists with the stored one)."""
    key = "\0".join((room_id, sender, device_id or "", txn_id)).encode()
    return "$" + hashlib.blake2b(key, digest_size=16, person=b"fanout-txn").hexdigest()


class UnsupportedRoomVersion(BadEvent):
    """createRoom asked for a room version this server does not speak (400 M_UNSUPPORTED_ROOM_VERSION)."""


class IncompatibleRoomVersion(BadEvent):
    """A remote server invited a user to a room of a version this server does not speak
    (400 M_INCOMPATIBLE_ROOM_VERSION, as federation's invite answers)."""
