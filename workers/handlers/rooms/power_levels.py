"""Power levels: who may send, invite, kick, ban and change what in a room (the spec's
`m.room.power_levels`, with its defaults).

Pure: `PowerLevels.from_state` reads the room's current `m.room.power_levels` content (or, when the
room has none, gives the creator 100 and everyone else 0), and the `may_*` checks answer with the
reason a request is refused, or None. Values that are not integers (or numeric strings, which old
rooms allowed) fall back to the default, so a malformed state event can never raise here.

A new power levels event is judged on its content as sent, as the spec's rules 10.x say: a level is
"added, changed or removed" when the key is, whatever the default it stands for (a `redact: 50` added
where the room had none changes nothing the room enforces, yet a sender below 50 may not add it:
Synapse refuses it, and every server replaying the room would). `content_problem` is the room
versions' (10, 11) check that the content's levels are integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The top-level levels and their defaults when the event leaves them out.
_DEFAULTS = {"users_default": 0, "events_default": 0, "state_default": 50, "ban": 50, "kick": 50,
             "invite": 0, "redact": 50}  # fmt: skip


def _integer(value: Any) -> int | None:
    """An int, or a numeric string (old rooms allowed them); None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _levels(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {str(k): level for k, v in value.items() if (level := _integer(v)) is not None}


@dataclass(frozen=True, slots=True)
class PowerLevels:
    users: Mapping[str, int] = field(default_factory=dict)
    events: Mapping[str, int] = field(default_factory=dict)
    top: Mapping[str, int] = field(default_factory=lambda: dict(_DEFAULTS))
    #: The current event's content as stored (None: the room has no power levels event).
    content: Mapping[str, Any] | None = None

    @classmethod
    def from_state(cls, content: dict[str, Any] | None, creator: str | None) -> PowerLevels:
        """From the current `m.room.power_levels` content; None: the room has none yet."""
        if content is None:
            return cls({creator: 100} if creator else {}, {}, {**_DEFAULTS, "state_default": 0})
        top = {key: _or(_integer(content.get(key)), default) for key, default in _DEFAULTS.items()}
        return cls(_levels(content.get("users")), _levels(content.get("events")), top, content)

    def user(self, user_id: str) -> int:
        return self.users.get(user_id, self.top["users_default"])

    def required(self, event_type: str, is_state: bool) -> int:
        default = self.top["state_default"] if is_state else self.top["events_default"]
        return self.events.get(event_type, default)

    def may_send(self, sender: str, event_type: str, is_state: bool) -> str | None:
        needed, has = self.required(event_type, is_state), self.user(sender)
        return None if has >= needed else f"sending {event_type} needs power {needed}, {sender} has {has}"

    def may_act_on(self, action: str, sender: str, target: str) -> str | None:
        """`action` is invite, kick or ban (unbanning needs the ban level)."""
        needed, has = self.top[action], self.user(sender)
        if has < needed:
            return f"{action} needs power {needed}, {sender} has {has}"
        if action != "invite" and self.user(target) >= has:
            return f"{sender} (power {has}) cannot {action} {target} (power {self.user(target)})"
        return None

    def may_redact(self, sender: str, target_sender: str | None) -> str | None:
        """Redacting one's own event needs only the right to send the redaction; another's
        event needs the `redact` level."""
        needed, has = self.top["redact"], self.user(sender)
        if target_sender == sender or has >= needed:
            return None
        return f"redacting another's event needs power {needed}, {sender} has {has}"

    def may_change_to(self, sender: str, new: Mapping[str, Any]) -> str | None:
        """A new `m.room.power_levels` content from `sender` (`content_problem` passed): no level it
        adds, changes or removes may be above the sender's own, before or after, and it may not
        touch another user at or above the sender's level. Keys compare as sent, never through
        their defaults. The room's first power levels event is not limited."""
        if self.content is None:
            return None
        has = self.user(sender)
        changes = [("", key, self.content.get(key), new.get(key)) for key in _DEFAULTS]
        for name in ("events", "notifications", "users"):
            old_map, new_map = _mapping(self.content.get(name)), _mapping(new.get(name))
            changes += [(name, key, old_map.get(key), new_map.get(key)) for key in {*old_map, *new_map}]
        for section, key, old_value, new_value in changes:
            old_level, new_level = _integer(old_value), _integer(new_value)
            if old_level == new_level:
                continue
            if section == "users" and key != sender and old_level is not None and old_level >= has:
                return f"{sender} (power {has}) cannot change the level of {key} ({old_level})"
            if any(level is not None and level > has for level in (old_level, new_level)):
                what = f"{section}.{key}" if section else key
                return f"{sender} (power {has}) cannot change {what} from {old_level} to {new_level}"
        return None


def content_problem(content: Mapping[str, Any]) -> str | None:
    """What makes `content` an invalid `m.room.power_levels` in room versions 10 and 11 (integers
    only: no numeric strings, no booleans; `users` keyed by user ids), or None."""
    for key in _DEFAULTS:
        if key in content and not _strict_int(content[key]):
            return f"{key} must be an integer"
    for name in ("events", "notifications", "users"):
        value = content.get(name, {})
        if not isinstance(value, dict) or not all(_strict_int(v) for v in value.values()):
            return f"{name} must be an object whose values are integers"
    if not all(user.startswith("@") and ":" in user for user in content.get("users", {})):
        return "users must be keyed by user ids (@name:server)"
    return None


def _strict_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
