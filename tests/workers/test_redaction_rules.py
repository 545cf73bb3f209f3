"""workers.redaction_rules: the spec's redaction algorithm for each family of room versions, and for
the versions this server makes, the same content as Synapse's own pruning."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from workers.harness.bench.peer.synapse_build import build_synapse
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


#: Prunes each case's content with Synapse's own `prune_event`, in Synapse's virtualenv (stdin: the
#: room version and the cases; stdout: the pruned contents).
_SYNAPSE_PRUNE = """
import json, sys
from synapse.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse.events import make_event_from_dict
from synapse.events.utils import prune_event
version, cases = json.load(sys.stdin)
plain = lambda o: dict(o) if hasattr(o, "keys") else list(o)
fields = {"room_id": "!r:hs", "sender": "@a:hs", "state_key": "", "prev_events": [], "auth_events": [],
          "depth": 1, "origin_server_ts": 1, "hashes": {"sha256": "A" * 43}, "signatures": {}}
room = KNOWN_ROOM_VERSIONS[version]
pruned = [prune_event(make_event_from_dict({**fields, **case}, room)) for case in cases]
json.dump([e.get_dict()["content"] for e in pruned], sys.stdout, default=plain)
"""


@pytest.mark.parametrize("version", ["10", "11"])
def test_pruning_matches_synapse(version: str) -> None:
    """Every event type the algorithm treats specially (and two it does not), each with keys some
    version keeps and one none does, pruned here and by Synapse 1.163.2's own code: the same content
    (what a redacted event reads as, and what the rules then judge)."""
    synapse = build_synapse(say=lambda line: None)
    contents = (MEMBER, CREATE, JOIN_RULES, POWER, ALIASES, VISIBILITY, REDACTION, MESSAGE)
    kinds = ("m.room.member", "m.room.create", "m.room.join_rules", "m.room.power_levels", "m.room.aliases",
             "m.room.history_visibility", "m.room.redaction", "m.room.message", "m.room.topic")  # fmt: skip
    cases = [
        {"type": kind, "content": {**content, "none_keeps": 1}} for kind in kinds for content in contents
    ]
    answer = subprocess.run(
        [str(synapse.python), "-c", _SYNAPSE_PRUNE], input=json.dumps([version, cases]),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    theirs = json.loads(answer.stdout)
    ours = [prune_content(case["type"], case["content"], rules_for(version)) for case in cases]
    assert len(theirs) == len(cases) == 72
    assert [(c["type"], o) for c, o in zip(cases, ours, strict=True)] == [
        (c["type"], t) for c, t in zip(cases, theirs, strict=True)
    ]
