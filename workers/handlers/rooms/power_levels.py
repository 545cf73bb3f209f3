"""Power levels: who may send, invite, kick, ban and change what in a room (the spec's
`m.room.power_levels`, with its defaults).

Pure: `PowerLevels.from_state` reads the room's current `m.room.power_levels` content (or, when the
room has none, gives the creator 100 and everyone else 0), and the `may_*` checks answer with the
reason a request is refused, or None. Values that are not integers (or numeric strings, which old
rooms allowed) fall back to the default, so a malformed state event can never raise here.
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

    @classmethod
    def from_state(cls, content: dict[str, Any] | None, creator: str | None) -> PowerLevels:
        """From the current `m.room.power_levels` content; None: the room has none yet."""
        if content is None:
            return cls({creator: 100} if creator else {}, {}, {**_DEFAULTS, "state_default": 0})
        top = {key: _or(_integer(content.get(key)), default) for key, default in _DEFAULTS.items()}
        return cls(_levels(content.get("users")), _levels(content.get("events")), top)

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

    def may_change_to(self, sender: str, new: PowerLevels) -> str | None:
        """A new `m.room.power_levels` from `sender`: no level it grants, removes or moves may be
        above the sender's own, and it may not touch users at or above its level (but itself)."""
        has = self.user(sender)
        for user in set(self.users) | set(new.users):
            old_level, new_level = self.users.get(user), new.users.get(user)
            if old_level == new_level:
                continue
            if user != sender and old_level is not None and old_level >= has:
                return f"{sender} (power {has}) cannot change the level of {user} ({old_level})"
            if new_level is not None and new_level > has:
                return f"{sender} (power {has}) cannot grant power {new_level}"
        for mapping_old, mapping_new in ((self.events, new.events), (self.top, new.top)):
            for key in set(mapping_old) | set(mapping_new):
                old_level, new_level = mapping_old.get(key), mapping_new.get(key)
                if old_level != new_level and max(old_level or 0, new_level or 0) > has:
                    return f"{sender} (power {has}) cannot change the level of {key}"
        return None


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
