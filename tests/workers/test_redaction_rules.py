"""workers.redaction_rules: the spec's redaction algorithm for each family of room versions."""

from __future__ import annotations

from typing import Any

import pytest

from workers.redaction_rules import prune_content, prune_event, rules_for

#: One event of every type the algorithm treats specially, with keys kept by some version only.
MEMBER = {"membership": "join", "displayname": "A", "join_authorised_via_users_server": "@s:hs",
          "third_party_invite": {"display_name": "x", "signed": {"token": "t"}}}  # fmt: skip
CREATE = {"creator": "@a:hs", "room_version": "1", "m.federate": False}
JOIN_RULES = {"join_rule": "restricted", "allow": [{"type": "m.room_membership"}], "extra": 1}
POWER = {"ban": 50, "events": {}, "events_default": 0, "invite": 0, "kick": 50, "redact": 50,
         "state_default": 50, "users": {"@a:hs": 100}, "users_default": 0,
         "notifications": {"room": 50}}  # fmt: skip
ALIASES = {"aliases": ["#a:hs"], "other": 1}
VISIBILITY = {"history_visibility": "shared", "other": 1}
REDACTION = {"redacts": "$target", "reason": "spam"}
MESSAGE = {"msgtype": "m.text", "body": "secret"}
POWER_KEPT = {k: v for k, v in POWER.items() if k not in ("invite", "notifications")}


def _pruned(version: str) -> dict[str, dict[str, Any]]:
    rules = rules_for(version)
    return {
        "m.room.member": prune_content("m.room.member", MEMBER, rules),
        "m.room.create": prune_content("m.room.create", CREATE, rules),
        "m.room.join_rules": prune_content("m.room.join_rules", JOIN_RULES, rules),
        "m.room.power_levels": prune_content("m.room.power_levels", POWER, rules),
        "m.room.aliases": prune_content("m.room.aliases", ALIASES, rules),
        "m.room.history_visibility": prune_content("m.room.history_visibility", VISIBILITY, rules),
        "m.room.redaction": prune_content("m.room.redaction", REDACTION, rules),
        "m.room.message": prune_content("m.room.message", MESSAGE, rules),
    }


BASE = {
    "m.room.member": {"membership": "join"},
    "m.room.create": {"creator": "@a:hs"},
    "m.room.join_rules": {"join_rule": "restricted"},
    "m.room.power_levels": POWER_KEPT,
    "m.room.aliases": {"aliases": ["#a:hs"]},
    "m.room.history_visibility": {"history_visibility": "shared"},
    "m.room.redaction": {},
    "m.room.message": {},
}
V6 = {**BASE, "m.room.aliases": {}}
V8 = {**V6, "m.room.join_rules": {"join_rule": "restricted", "allow": [{"type": "m.room_membership"}]}}
V9 = {**V8, "m.room.member": {"membership": "join", "join_authorised_via_users_server": "@s:hs"}}
V11 = {
    **V9,
    "m.room.member": {
        "membership": "join",
        "join_authorised_via_users_server": "@s:hs",
        "third_party_invite": {"signed": {"token": "t"}},
    },
    "m.room.create": CREATE,
    "m.room.power_levels": {**POWER_KEPT, "invite": 0},
    "m.room.redaction": {"redacts": "$target"},
}


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        (("1", "2", "3", "4", "5"), BASE),
        (("6", "7"), V6),
        (("8",), V8),
        (("9", "10"), V9),
        (("11",), V11),
        (("org.example.unknown", ""), BASE),
    ],
    ids=["v1-v5", "v6-v7", "v8", "v9-v10", "v11", "unknown"],
)
def test_content_kept_per_version_family(versions: tuple[str, ...], expected: dict[str, Any]) -> None:
    for version in versions:
        assert _pruned(version) == expected, version


def test_top_level_keys_kept_before_and_from_11() -> None:
    event = {
        "event_id": "$e", "type": "m.room.member", "room_id": "!r", "sender": "@a:hs", "state_key": "@a:hs",
        "content": {"membership": "join", "displayname": "A"}, "hashes": {"sha256": "h"},
        "signatures": {"hs": {}}, "depth": 3, "prev_events": ["$p"], "prev_state": [], "auth_events": ["$a"],
        "origin": "hs", "origin_server_ts": 5, "membership": "join", "unsigned": {"age": 1},
        "redacts": "$x", "extra": True,
    }  # fmt: skip
    before = prune_event(event, rules_for("10"))
    assert set(before) == set(event) - {"unsigned", "redacts", "extra"}
    assert before["content"] == {"membership": "join"}
    after = prune_event(event, rules_for("11"))
    assert set(after) == set(before) - {"origin", "membership", "prev_state"}
    # A third-party invite without `signed` keeps nothing of it; content that is not an object: {}.
    odd = {**event, "content": {"membership": "invite", "third_party_invite": {"display_name": "x"}}}
    assert prune_event(odd, rules_for("11"))["content"] == {"membership": "invite"}
    assert prune_event({**event, "content": "text"}, rules_for("11"))["content"] == {}


def test_pruning_leaves_the_original_alone() -> None:
    content = dict(MEMBER)
    prune_content("m.room.member", content, rules_for("11"))
    assert content == MEMBER
    kept = prune_content("m.room.create", CREATE, rules_for("11"))
    assert kept == CREATE and kept is not CREATE
