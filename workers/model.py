"""The domain types the worker passes between its storage, handlers and HTTP layer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any, NamedTuple

import pydantic_core

MEMBER_EVENT = "m.room.member"
CREATE_EVENT = "m.room.create"
VISIBILITY_EVENT = "m.room.history_visibility"
REDACTION_EVENT = "m.room.redaction"
#: What an id in an events-stream row may look like (readers refuse a row with anything else).
ROW_ID_PATTERN = r"^[!$@#A-Za-z0-9_.:=\-/+]{1,255}$"
_ROW_ID = re.compile(ROW_ID_PATTERN)
#: The version of a room whose m.room.create content names none (the spec's default for that case).
IMPLICIT_ROOM_VERSION = "1"
#: The room versions this server creates rooms in and accepts invites to.
SUPPORTED_ROOM_VERSIONS = ("10", "11")
DEFAULT_ROOM_VERSION = "10"
MEMBERSHIPS = frozenset({"join", "leave", "invite", "ban", "knock"})
#: The memberships of a user who is in a room or asked to be: what a leave, kick or purge acts on.
PRESENT = frozenset({"join", "invite", "knock"})
# Rows of the caches stream whose keys are room ids, each followed by the members whose membership
# moved in it ([!room, @member, ..., !room2, ...]; the sigil tells them apart): one row covers
# every cache that depends on those rooms' current state and on those members' room lists.
CURRENT_STATE_CACHE = "cs_cache_fake"
#: Rows of the caches stream whose keys are the hex SHA-256 of access tokens that ended (Synapse's
#: cache of the same purpose has this name); keys None: every cached token.
ACCESS_TOKEN_CACHE = "get_user_by_access_token"
#: Rows of the caches stream whose keys are a room id that no local user is in any more (its last
#: local member left), or that was purged, followed by the users whose room lists it changed:
#: every worker drops what it keeps of the room (`SyncCaches.on_invalidations`). Named like
#: `cs_cache_fake` because they are batched the same way: the audit counts each key of a row.
ROOM_EMPTIED_CACHE = "emptied_room_cache_fake"
ROOM_PURGED_CACHE = "purged_room_cache_fake"
MEMBERS_PER_INVALIDATION = 50
#: The most keys one such row carries (the caches stream's row type bounds it the same way).
KEYS_PER_INVALIDATION = MEMBERS_PER_INVALIDATION + 1
_new = tuple.__new__
#: JSON string literals of the strings that repeat from event to event (room ids, types, senders,
#: state keys, instance names): a dict hit costs a third of escaping again. Emptied when full.
_LITERALS: dict[str, str] = {}
_LITERALS_MAX = 4096


def _literal(value: str) -> str:
    """`value` as a JSON string literal, remembered in `_LITERALS`."""
    if len(_LITERALS) >= _LITERALS_MAX:
        _LITERALS.clear()
    text = _LITERALS[value] = encode_basestring(value)
    return text


def membership_of(event_type: str, content: dict[str, Any]) -> str | None:
    """The membership an event sets: content.membership of an m.room.member event when it is one of
    MEMBERSHIPS, else None (a backfilled event may carry anything there)."""
    if event_type != MEMBER_EVENT:
        return None
    value = content.get("membership")
    return value if isinstance(value, str) and value in MEMBERSHIPS else None


def redacts_of(event_type: str, content: dict[str, Any]) -> str | None:
    """The event an m.room.redaction names (`content.redacts`), when it is one an events-stream
    row can carry (an id that is not one names no stored event, so nothing is redacted by it)."""
    if event_type != REDACTION_EVENT:
        return None
    value = content.get("redacts")
    return value if isinstance(value, str) and _ROW_ID.match(value) else None


def room_version_of(create_content: dict[str, Any]) -> str:
    """The room version an m.room.create event's content declares."""
    version = create_content.get("room_version", IMPLICIT_ROOM_VERSION)
    return version if isinstance(version, str) else IMPLICIT_ROOM_VERSION


class NewEvent(NamedTuple):
    """An event a client asked to send, before it has a stream ordering. (NewEvent and Event are
    NamedTuples, immutable like frozen dataclasses at a third of the construction cost: the write
    path builds both for every event.)"""

    event_id: str
    room_id: str
    type: str
    sender: str
    content: dict[str, Any]
    state_key: str | None = None

    @property
    def membership(self) -> str | None:
        """The membership this event sets, for m.room.member events."""
        return membership_of(self.type, self.content)

    def persisted(self, stream_ordering: int, instance_name: str, received_ts: int) -> Event:
        """This event as stored (its fields are Event's, in Event's order, between these)."""
        return _new(Event, (stream_ordering, instance_name, *self, received_ts, None))  # no Python __new__


class Event(NamedTuple):
    """A persisted event: live ones have positive stream orderings, backfilled ones negative.

    A redacted event, as the storage layer reads it, has its content pruned by its room's version
    and `redacted_because`, the redaction that pruned it (rendered into `unsigned`)."""

    stream_ordering: int
    instance_name: str
    event_id: str
    room_id: str
    type: str
    sender: str
    content: dict[str, Any]
    state_key: str | None
    received_ts: int
    redacted_because: Event | None = None

    @property
    def membership(self) -> str | None:
        return membership_of(self.type, self.content)

    def to_json(self) -> str:
        """The stored JSON form: `client_dict()` as compact UTF-8 JSON (see `json_texts`)."""
        return self.json_texts()[0]

    def json_texts(self, room_version: str | None = None) -> tuple[str, str]:
        """(the stored JSON, the JSON array of the event's `events` stream row, which carries the
        room's version and, for a redaction only, the event it redacts: the trailing field is left
        out of every other row, where readers take its default).

        The persister needs both for every event, so they are built together, as text: each string
        is escaped once, by the standard library's C encoder, for both (escaping cost about 150 ns a
        string; building a dict and serialising it, three times as much), and the strings that
        repeat from event to event are looked up in `_LITERALS`. `tests/workers` checks the first
        against `client_dict()` and the second against `EventRow.of`."""
        known, q = _LITERALS.get, encode_basestring
        room_id = known(self.room_id) or _literal(self.room_id)
        kind = known(self.type) or _literal(self.type)
        sender = known(self.sender) or _literal(self.sender)
        event_id, instance = q(self.event_id), known(self.instance_name) or _literal(self.instance_name)
        if self.state_key is None:
            state_key, state = "null", ""
        else:
            state_key = known(self.state_key) or _literal(self.state_key)
            state = f',"state_key":{state_key}'
        membership = self.membership if self.type == MEMBER_EVENT else None
        stored = (
            f'{{"event_id":{event_id},"room_id":{room_id},"type":{kind},"sender":{sender},'
            f'"content":{pydantic_core.to_json(self.content).decode()},"origin_server_ts":{self.received_ts},'
            f'"stream_ordering":{self.stream_ordering},"instance_name":{instance}{state}}}'
        )
        version = "null" if room_version is None else known(room_version) or _literal(room_version)
        redacts = redacts_of(self.type, self.content) if self.type == REDACTION_EVENT else None
        row = (
            f"[{event_id},{room_id},{kind},{sender},{state_key},"
            f"{'null' if membership is None else _literal(membership)},{version}"
            f"{']' if redacts is None else f',{q(redacts)}]'}"
        )
        return stored, row

    def matrix(self, *, room_id: bool = True) -> dict[str, Any]:
        """The event in the client-server API's format (`room_id` left out inside a sync room,
        where the spec omits it)."""
        body: dict[str, Any] = {
            "type": self.type,
            "content": self.content,
            "event_id": self.event_id,
            "sender": self.sender,
            "origin_server_ts": self.received_ts,
            "unsigned": {},
        }
        if room_id:
            body["room_id"] = self.room_id
        if self.state_key is not None:
            body["state_key"] = self.state_key
        return body

    def stripped(self) -> dict[str, Any]:
        """The stripped state form (invites): type, state_key, content, sender."""
        return {
            "type": self.type,
            "state_key": self.state_key or "",
            "content": self.content,
            "sender": self.sender,
        }

    def client_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "event_id": self.event_id,
            "room_id": self.room_id,
            "type": self.type,
            "sender": self.sender,
            "content": self.content,
            "origin_server_ts": self.received_ts,
            "stream_ordering": self.stream_ordering,
            "instance_name": self.instance_name,
        }
        if self.state_key is not None:
            body["state_key"] = self.state_key
        return body


@dataclass(frozen=True, slots=True)
class CacheInvalidation:
    """One row of the caches stream: invalidate `keys` of `cache_func` (keys None: everything)."""

    cache_func: str
    keys: tuple[str, ...] | None
    invalidation_ts: int


@dataclass(frozen=True, slots=True)
class UserRooms:
    """The rooms a user has a membership in, and per room the user's membership changes in stream
    order: what sync needs to decide visibility, cached as one entry per user."""

    rooms: frozenset[str]
    history: dict[str, tuple[tuple[int, str], ...]]

    def joined(self) -> set[str]:
        """The rooms the user is joined to now."""
        return {r for r, changes in self.history.items() if changes and changes[-1][1] == "join"}

    def with_change(self, room_id: str, position: int, membership: str) -> UserRooms:
        """These rooms after the user's member event at `position` (live, so positive) set
        `membership` in `room_id`: what a load from the database would return once it is stored.
        Unchanged when the history holds it already (a load may have read it before its row came)."""
        changes = self.history.get(room_id, ())
        if any(at == position for at, _ in changes):
            return self
        merged = tuple(sorted((*changes, (position, membership))))
        return UserRooms(self.rooms | {room_id}, {**self.history, room_id: merged})


@dataclass(slots=True)
class StateChanges:
    """What a batch of events changes in current state, per room: the members whose membership moved."""

    rooms: dict[str, list[str]] = field(default_factory=dict)

    def add(self, event: NewEvent | Event) -> None:
        if event.state_key is None:
            return
        members = self.rooms.setdefault(event.room_id, [])
        if event.type == MEMBER_EVENT and event.state_key not in members:
            members.append(event.state_key)

    def invalidations(self, now_ms: int) -> list[CacheInvalidation]:
        """The batch's changes in as few rows as fit: every room with its members, coalesced into
        rows of at most KEYS_PER_INVALIDATION keys (a room with more members than fit continues in
        the next row, its id first again), so one batch sends one row unless it changed a lot."""
        rows: list[CacheInvalidation] = []
        keys: list[str] = []
        for room_id, members in self.rooms.items():
            if keys and len(keys) + 1 + len(members) > KEYS_PER_INVALIDATION:
                rows.append(CacheInvalidation(CURRENT_STATE_CACHE, tuple(keys), now_ms))
                keys = []
            keys.append(room_id)
            for member in members:
                if len(keys) == KEYS_PER_INVALIDATION:
                    rows.append(CacheInvalidation(CURRENT_STATE_CACHE, tuple(keys), now_ms))
                    keys = [room_id]
                keys.append(member)
        if keys:
            rows.append(CacheInvalidation(CURRENT_STATE_CACHE, tuple(keys), now_ms))
        return rows
