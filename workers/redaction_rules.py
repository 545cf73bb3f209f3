"""The spec's redaction algorithm, per room version: what of an event survives its redaction.

The algorithm keeps a fixed set of top-level keys and, for a few event types, the content keys the
authorisation rules need; everything else goes. Room versions change the lists, so a redacted
event is pruned by the rules of its room's version:

- 1 to 5: the base lists, plus `aliases` of m.room.aliases;
- 6 and 7: m.room.aliases loses its special case;
- 8: m.room.join_rules also keeps `allow`;
- 9 and 10: m.room.member also keeps `join_authorised_via_users_server`;
- 11: the top level no longer keeps `origin`, `membership`, `prev_state`; m.room.create keeps all
  its content, m.room.power_levels keeps `invite`, m.room.redaction keeps `redacts`, and
  m.room.member keeps the `signed` part of `third_party_invite`.

A version this server does not know is pruned by version 1's rules (the base algorithm). Pure
functions: the storage layer prunes what it reads with `prune_content`; `prune_event` is the whole
algorithm on a federation-shaped event, for completeness and tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_TOP_LEVEL = frozenset(
    {"event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures", "depth",
     "prev_events", "auth_events", "origin_server_ts"}
)  # fmt: skip
#: Top-level keys that versions 1 to 10 keep as well.
_TOP_LEVEL_BEFORE_11 = frozenset({"prev_state", "origin", "membership"})
_POWER_LEVELS = frozenset(
    {"ban", "events", "events_default", "kick", "redact", "state_default", "users", "users_default"}
)


@dataclass(frozen=True, slots=True)
class RedactionRules:
    """What distinguishes one version's algorithm from another's."""

    #: m.room.aliases keeps `aliases` (versions 1 to 5).
    aliases: bool = True
    #: m.room.join_rules keeps `allow` (8 on).
    join_rule_allow: bool = False
    #: m.room.member keeps `join_authorised_via_users_server` (9 on).
    join_authorised: bool = False
    #: The rules of version 11 (see the module docstring).
    updated: bool = False

    def content_keys(self, event_type: str) -> frozenset[str] | None:
        """The content keys an event of this type keeps (None: all of them)."""
        if event_type == "m.room.member":
            keys = {"membership"}
            if self.join_authorised:
                keys.add("join_authorised_via_users_server")
            if self.updated:
                keys.add("third_party_invite")  # of which only `signed` is kept
            return frozenset(keys)
        if event_type == "m.room.create":
            return None if self.updated else frozenset({"creator"})
        if event_type == "m.room.join_rules":
            return frozenset({"join_rule", "allow"} if self.join_rule_allow else {"join_rule"})
        if event_type == "m.room.power_levels":
            return _POWER_LEVELS | {"invite"} if self.updated else _POWER_LEVELS
        if event_type == "m.room.history_visibility":
            return frozenset({"history_visibility"})
        if event_type == "m.room.aliases" and self.aliases:
            return frozenset({"aliases"})
        if event_type == "m.room.redaction" and self.updated:
            return frozenset({"redacts"})
        return frozenset()


V1 = RedactionRules()
V6 = RedactionRules(aliases=False)
V8 = RedactionRules(aliases=False, join_rule_allow=True)
V9 = RedactionRules(aliases=False, join_rule_allow=True, join_authorised=True)
V11 = RedactionRules(aliases=False, join_rule_allow=True, join_authorised=True, updated=True)
_BY_VERSION = {
    "1": V1, "2": V1, "3": V1, "4": V1, "5": V1, "6": V6, "7": V6, "8": V8, "9": V9, "10": V9,
    "11": V11,
}  # fmt: skip


def rules_for(room_version: str) -> RedactionRules:
    """The redaction rules of a room version (version 1's for one this server does not know)."""
    return _BY_VERSION.get(room_version, V1)


def prune_content(event_type: str, content: dict[str, Any], rules: RedactionRules) -> dict[str, Any]:
    """The content an event of `event_type` keeps once redacted (a new dict; `content` untouched)."""
    keep = rules.content_keys(event_type)
    if keep is None:
        return dict(content)
    pruned = {key: value for key, value in content.items() if key in keep}
    invite = pruned.get("third_party_invite")
    if invite is not None:
        if isinstance(invite, dict) and "signed" in invite:
            pruned["third_party_invite"] = {"signed": invite["signed"]}
        else:
            del pruned["third_party_invite"]
    return pruned


def prune_event(event: dict[str, Any], rules: RedactionRules) -> dict[str, Any]:
    """The whole algorithm on an event as servers exchange it: the top-level keys kept, with the
    content pruned by `prune_content`."""
    kept = _TOP_LEVEL if rules.updated else _TOP_LEVEL | _TOP_LEVEL_BEFORE_11
    pruned = {key: value for key, value in event.items() if key in kept}
    content = event.get("content")
    if not isinstance(content, dict):
        content = {}
    pruned["content"] = prune_content(str(event.get("type", "")), content, rules)
    return pruned
