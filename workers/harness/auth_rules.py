"""The Matrix room authorization rules, written from the spec as an independent judge of what a
server stored (room versions 10 and 11: https://spec.matrix.org/latest/rooms/v10/#authorization-rules
and https://spec.matrix.org/latest/rooms/v11/#authorization-rules).

`RoomReplay` takes a room's events in stream order and judges each against the state the accepted
events before it left, as a server that authorizes a room's events in order would. An event that
breaks a rule is reported (`Violation`, naming the rule by its number in the spec's list) and then
treated as rejected: it changes no state, as the spec has a rejected event change none, so one bad
event is reported once rather than as a cascade of the events that follow it.

Pure and apart from the worker's own rules (`workers.handlers.rooms.rules` is never imported): a judge
that shares the code it judges cannot disagree with it.

What the spec leaves to a single server, judged here as this server intends (docs/api.md):
* the rules on event graphs (prev_events, auth_events, third-party invites, `m.federate`) do not
  apply: one server, one linear order per room;
* signatures: the one server signs its users' events and nothing else, so an event is signed by its
  sender's server only (rule 4.2 then refuses an authorising user of any other server);
* a redaction (rule-wise an ordinary event) of another sender's event needs the `redact` level,
  as the client-server spec says a server checks before it applies one ("C-S redact");
  a redaction applies to later checks: the state event it redacts counts as its pruned content
  (the room version's redaction algorithm).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

CREATE, MEMBER, POWER, JOIN_RULES, REDACTION = (
    "m.room.create", "m.room.member", "m.room.power_levels", "m.room.join_rules", "m.room.redaction",
)  # fmt: skip
#: A member event's authorising user (restricted joins), whose server must sign the event.
AUTHORISER = "join_authorised_via_users_server"
KNOWN_VERSIONS = frozenset({"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11"})
#: The versions judged here; a room of another version is reported, not judged.
JUDGED_VERSIONS = frozenset({"10", "11"})
_LEVEL_KEYS = ("users_default", "events_default", "state_default", "ban", "redact", "kick", "invite")


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as the server stored it, with its place in the room's order."""

    stream_ordering: int
    event_id: str
    room_id: str
    type: str
    sender: str
    content: Mapping[str, Any]
    state_key: str | None = None


@dataclass(frozen=True, slots=True)
class Violation:
    """`event` breaks the rule `rule` (its number in the spec's list, and what it says)."""

    event: StoredEvent
    rule: str
    detail: str

    def __str__(self) -> str:
        e = self.event
        key = "" if e.state_key is None else f"[{e.state_key}]"
        where = f"{e.room_id} #{e.stream_ordering} {e.event_id} {e.type}{key} from {e.sender}"
        return f"{where}: rule {self.rule}: {self.detail}"


class Rejected(Exception):
    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"{rule}: {detail}")
        self.rule, self.detail = rule, detail


def _domain(identifier: str) -> str:
    return identifier.partition(":")[2]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def prune(version: str, kind: str, content: Mapping[str, Any]) -> dict[str, Any]:
    """The content the redaction algorithm of room `version` keeps (v10, v11)."""
    keep: tuple[str, ...] = ()
    if kind == MEMBER:
        keep = ("membership", AUTHORISER)
    elif kind == CREATE:
        if version == "11":
            return dict(content)
        keep = ("creator",)
    elif kind == JOIN_RULES:
        keep = ("join_rule", "allow")
    elif kind == POWER:
        keep = (
            "ban",
            "events",
            "events_default",
            "kick",
            "redact",
            "state_default",
            "users",
            "users_default",
        )
        if version == "11":
            keep += ("invite",)
    elif kind == "m.room.history_visibility":
        keep = ("history_visibility",)
    elif kind == REDACTION and version == "11":
        keep = ("redacts",)
    pruned = {k: content[k] for k in keep if k in content}
    if kind == MEMBER and version == "11" and isinstance(content.get("third_party_invite"), dict):
        signed = content["third_party_invite"].get("signed")
        if signed is not None:
            pruned["third_party_invite"] = {"signed": signed}
    return pruned


@dataclass(slots=True)
class RoomReplay:
    """One room's state as its accepted events left it; `judge` each event in stream order."""

    room_id: str
    #: (type, state_key) -> the accepted state event there now.
    state: dict[tuple[str, str], StoredEvent] = field(default_factory=dict)
    #: Every accepted event's sender, by id (a redaction's target may be any earlier event).
    senders: dict[str, str] = field(default_factory=dict)
    redacted: set[str] = field(default_factory=set)
    version: str = "1"
    judged: int = 0
    violations: list[Violation] = field(default_factory=list)

    def judge(self, event: StoredEvent) -> Violation | None:
        """Check `event` against the state so far; accept it (apply it) or report it (skip it)."""
        self.judged += 1
        try:
            self._check(event)
        except Rejected as e:
            violation = Violation(event, e.rule, e.detail)
            self.violations.append(violation)
            return violation
        self._apply(event)
        return None

    # -- state as the rules read it ------------------------------------------------------------

    def _content(self, kind: str, state_key: str = "") -> Mapping[str, Any] | None:
        event = self.state.get((kind, state_key))
        if event is None:
            return None
        return prune(self.version, kind, event.content) if event.event_id in self.redacted else event.content

    def membership(self, user_id: str) -> str:
        content = self._content(MEMBER, user_id)
        value = None if content is None else content.get("membership")
        return value if isinstance(value, str) else "leave"

    def _creator(self) -> str | None:
        create = self.state.get((CREATE, ""))
        if create is None:
            return None
        if self.version == "11":
            return create.sender
        creator = (self._content(CREATE) or {}).get("creator")
        return creator if isinstance(creator, str) else None

    def _levels(self) -> Mapping[str, Any] | None:
        return self._content(POWER)

    def level_of(self, user_id: str) -> int:
        levels = self._levels()
        if levels is None:
            return 100 if user_id == self._creator() else 0
        users = levels.get("users")
        if isinstance(users, dict) and _is_int(users.get(user_id)):
            return int(users[user_id])
        return self._top("users_default")

    def _top(self, key: str) -> int:
        levels = self._levels()
        if levels is None:
            return 0 if key in ("users_default", "events_default", "state_default", "invite") else 50
        value = levels.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return 50 if key in ("state_default", "ban", "kick", "redact") else 0

    def required_for(self, kind: str, is_state: bool) -> int:
        levels = self._levels()
        events = None if levels is None else levels.get("events")
        if isinstance(events, dict) and _is_int(events.get(kind)):
            return int(events[kind])
        return self._top("state_default" if is_state else "events_default")

    # -- the rules --------------------------------------------------------------------------------

    def _check(self, event: StoredEvent) -> None:
        if event.type == CREATE and event.state_key == "":
            self._check_create(event)
            return
        if (CREATE, "") not in self.state:
            raise Rejected("2.4", "no m.room.create before this event")
        if self.version not in JUDGED_VERSIONS:
            raise Rejected("1.3", f"room version {self.version} is not one this judge knows")
        if event.type == MEMBER:
            self._check_member(event)
            return
        sender_membership = self.membership(event.sender)
        if sender_membership != "join":
            raise Rejected("5", f"the sender's membership is {sender_membership}, not join")
        needed, has = self.required_for(event.type, event.state_key is not None), self.level_of(event.sender)
        if needed > has:
            raise Rejected("7", f"{event.type} needs power {needed}, the sender has {has}")
        if (
            event.state_key is not None
            and event.state_key.startswith("@")
            and event.state_key != event.sender
        ):
            raise Rejected("8", "a state_key starting with @ must be the sender")
        if event.type == POWER and event.state_key == "":
            self._check_power_levels(event)
        if event.type == REDACTION:
            self._check_redaction(event)

    def _check_create(self, event: StoredEvent) -> None:
        if self.state:
            raise Rejected("1.1", "m.room.create after other events (it must have no previous events)")
        if _domain(event.room_id) != _domain(event.sender):
            raise Rejected("1.2", "the room id's domain is not the sender's")
        version = event.content.get("room_version", "1")
        if version not in KNOWN_VERSIONS:
            raise Rejected("1.3", f"unknown room version {version!r}")
        if version != "11" and "creator" not in event.content:
            raise Rejected("1.4", "content has no creator (room versions before 11)")

    def _check_member(self, event: StoredEvent) -> None:
        target, membership = event.state_key, event.content.get("membership")
        if target is None or not isinstance(membership, str):
            raise Rejected("4.1", "no state_key or no content.membership")
        if AUTHORISER in event.content:
            authoriser = event.content[AUTHORISER]
            if not isinstance(authoriser, str) or _domain(authoriser) != _domain(event.sender):
                raise Rejected("4.2", f"not signed by the server of {AUTHORISER} {authoriser!r}")
        sender, sender_membership = event.sender, self.membership(event.sender)
        target_membership = self.membership(target)
        join_rule = (self._content(JOIN_RULES) or {}).get("join_rule", "invite")
        if membership == "join":
            if len(self.state) == 1 and target == self._creator_for_first_join():
                return
            if sender != target:
                raise Rejected("4.3.2", "the sender is not the user who joins")
            if sender_membership == "ban":
                raise Rejected("4.3.3", "the sender is banned")
            if join_rule in ("invite", "knock"):
                if sender_membership not in ("invite", "join"):
                    raise Rejected("4.3.4", f"join rule {join_rule} and the sender is {sender_membership}")
                return
            if join_rule in ("restricted", "knock_restricted"):
                if sender_membership in ("invite", "join"):
                    return
                authoriser = event.content.get(AUTHORISER)
                if not isinstance(authoriser, str) or self.membership(authoriser) != "join":
                    raise Rejected(
                        "4.3.5.2", f"join rule {join_rule}: {AUTHORISER} {authoriser!r} is not joined"
                    )
                if self.level_of(authoriser) < self._top("invite"):
                    raise Rejected("4.3.5.2", f"join rule {join_rule}: {authoriser} may not invite")
                return
            if join_rule == "public":
                return
            raise Rejected("4.3.7", f"join rule {join_rule!r} admits no join")
        if membership == "invite":
            if sender_membership != "join":
                raise Rejected("4.4.2", f"the sender's membership is {sender_membership}, not join")
            if target_membership in ("join", "ban"):
                raise Rejected("4.4.3", f"the target's membership is {target_membership}")
            if self.level_of(sender) < self._top("invite"):
                raise Rejected(
                    "4.4.4", f"invite needs power {self._top('invite')}, sender has {self.level_of(sender)}"
                )
            return
        if membership == "leave":
            if sender == target:
                if sender_membership not in ("invite", "join", "knock"):
                    raise Rejected("4.5.1", f"the sender leaves from membership {sender_membership}")
                return
            if sender_membership != "join":
                raise Rejected("4.5.2", f"the sender's membership is {sender_membership}, not join")
            has = self.level_of(sender)
            if target_membership == "ban" and has < self._top("ban"):
                raise Rejected("4.5.3", f"unban needs power {self._top('ban')}, the sender has {has}")
            if has >= self._top("kick") and self.level_of(target) < has:
                return
            raise Rejected("4.5.4", f"kick needs power {self._top('kick')} and more than the target's")
        if membership == "ban":
            if sender_membership != "join":
                raise Rejected("4.6.1", f"the sender's membership is {sender_membership}, not join")
            has = self.level_of(sender)
            if has >= self._top("ban") and self.level_of(target) < has:
                return
            raise Rejected("4.6.2", f"ban needs power {self._top('ban')} and more than the target's")
        if membership == "knock":
            if join_rule not in ("knock", "knock_restricted"):
                raise Rejected("4.7.1", f"join rule {join_rule!r} takes no knock")
            if sender != target:
                raise Rejected("4.7.2", "the sender is not the user who knocks")
            if sender_membership in ("ban", "invite", "join"):
                raise Rejected("4.7.4", f"the sender's membership is {sender_membership}")
            return
        raise Rejected("4.8", f"unknown membership {membership!r}")

    def _creator_for_first_join(self) -> str | None:
        """Rule 4.3.1: the only previous event is the create event and the target is its creator
        (v10: content.creator; v11: the create event's sender)."""
        return self._creator()

    def _check_power_levels(self, event: StoredEvent) -> None:
        new = event.content
        for key in _LEVEL_KEYS:
            if key in new and not _is_int(new[key]):
                raise Rejected("9.1", f"{key} is not an integer")
        for key in ("events", "notifications"):
            value = new.get(key, {})
            if not isinstance(value, dict) or not all(_is_int(v) for v in value.values()):
                raise Rejected("9.2", f"{key} is not an object of integers")
        users = new.get("users", {})
        if not isinstance(users, dict) or not all(
            isinstance(u, str) and u.startswith("@") and ":" in u and _is_int(v) for u, v in users.items()
        ):
            raise Rejected("9.3", "users is not an object of user ids to integers")
        old = self._levels()
        if old is None:
            return
        has = self.level_of(event.sender)
        for key in _LEVEL_KEYS:
            self._change("9.5", key, old.get(key), new.get(key), has)
        for name in ("events", "notifications"):
            old_map, new_map = old.get(name), new.get(name)
            old_map = old_map if isinstance(old_map, dict) else {}
            new_map = new_map if isinstance(new_map, dict) else {}
            for key in set(old_map) | set(new_map):
                self._change("9.6-9.7", f"{name}.{key}",
                             old_map.get(key), new_map.get(key), has)  # fmt: skip
        old_users = old.get("users") if isinstance(old.get("users"), dict) else {}
        assert isinstance(old_users, dict)
        for user in set(old_users) | set(users):
            before, after = old_users.get(user), users.get(user)
            if before == after:
                continue
            if user != event.sender and before is not None and _is_int(before) and before >= has:
                raise Rejected("9.8", f"changes {user} whose level {before} is not below the sender's {has}")
            if after is not None and after > has:
                raise Rejected("9.9", f"gives {user} level {after}, above the sender's {has}")

    @staticmethod
    def _change(rule: str, key: str, before: Any, after: Any, has: int) -> None:
        """An added, changed or removed level: neither its old nor its new value above `has`."""
        if before == after:
            return
        if _is_int(before) and before > has:
            raise Rejected(rule, f"changes {key} from {before}, above the sender's {has}")
        if _is_int(after) and after > has:
            raise Rejected(rule, f"changes {key} to {after}, above the sender's {has}")

    def _check_redaction(self, event: StoredEvent) -> None:
        redacts = event.content.get("redacts")
        if not isinstance(redacts, str):
            raise Rejected("C-S redact", "a redaction names the event it redacts in content.redacts")
        target_sender = self.senders.get(redacts)
        if target_sender == event.sender:
            return
        needed, has = self._top("redact"), self.level_of(event.sender)
        if has < needed:
            raise Rejected("C-S redact", f"redacting another's event needs power {needed}, sender has {has}")

    # -- accepted: apply -----------------------------------------------------------------------

    def _apply(self, event: StoredEvent) -> None:
        if event.type == CREATE and event.state_key == "":
            version = event.content.get("room_version", "1")
            self.version = version if isinstance(version, str) else "1"
        self.senders[event.event_id] = event.sender
        if event.state_key is not None:
            self.state[(event.type, event.state_key)] = event
        if event.type == REDACTION:
            redacts = event.content.get("redacts")
            if isinstance(redacts, str) and redacts in self.senders:
                self.redacted.add(redacts)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay of rooms found: events judged, rooms judged, rooms not judged (no create
    event stored: a room that lives on another server), and every violation."""

    events: int
    rooms: int
    foreign_rooms: int
    violations: tuple[Violation, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "events_replayed": self.events,
            "rooms_replayed": self.rooms,
            "rooms_not_judged": self.foreign_rooms,
            "violations": len(self.violations),
            "first_violations": [str(v) for v in self.violations[:20]],
        }


def replay(events: Iterable[StoredEvent]) -> ReplayResult:
    """Judge `events` (any rooms, each room's in stream order) room by room."""
    rooms: dict[str, RoomReplay] = {}
    foreign: set[str] = set()
    for event in events:
        if event.room_id in foreign:
            continue
        room = rooms.get(event.room_id)
        if room is None:
            if event.type != CREATE:
                foreign.add(event.room_id)
                continue
            room = rooms[event.room_id] = RoomReplay(event.room_id)
        room.judge(event)
    violations = tuple(v for room in rooms.values() for v in room.violations)
    judged = sum(room.judged for room in rooms.values())
    return ReplayResult(judged, len(rooms), len(foreign), violations)
