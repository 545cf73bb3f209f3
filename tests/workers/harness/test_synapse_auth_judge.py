"""workers/harness/synapse_auth_judge.py: Synapse's own `event_auth`, run in Synapse's virtualenv,
judges a stored room and refuses exactly the events its rules refuse (the judge must be able to
say no, or the cluster tests that use it prove nothing)."""

from __future__ import annotations

import asyncio
from typing import Any

from workers.harness.auth_replay import run_synapse_judge
from workers.harness.bench.peer.synapse_build import build_synapse

AUTHORISER = "join_authorised_via_users_server"


def _event(
    n: int, kind: str, sender: str, content: dict[str, Any], state_key: str | None = ""
) -> dict[str, Any]:
    return {"stream_ordering": n, "event_id": f"${n}", "type": kind, "sender": sender, "state_key": state_key,
            "content": content, "origin_server_ts": 1_700_000_000_000 + n}  # fmt: skip


async def test_synapse_refuses_what_its_rules_refuse_and_judges_in_stored_order() -> None:
    python = (await asyncio.to_thread(build_synapse, say=lambda line: None)).python
    power = {"users": {"@a:hs": 100, "@m:hs": 40}, "events": {"m.room.power_levels": 40}}
    events = [
        _event(1, "m.room.create", "@a:hs", {"creator": "@a:hs", "room_version": "10"}),
        _event(2, "m.room.member", "@a:hs", {"membership": "join"}, "@a:hs"),
        _event(3, "m.room.power_levels", "@a:hs", power),
        _event(4, "m.room.join_rules", "@a:hs", {"join_rule": "public"}),
        _event(5, "m.room.message", "@m:hs", {"body": "before joining"}, None),  # refused: not in the room
        _event(6, "m.room.member", "@m:hs", {"membership": "join"}, "@m:hs"),
        _event(7, "m.room.power_levels", "@m:hs", {**power, "redact": 50}),  # refused: adds a 50 at 40
        _event(8, "m.room.power_levels", "@m:hs", {**power, "redact": 40}),
        _event(9, "m.room.member", "@a:hs", {"membership": "invite"}, "@m:hs"),  # refused: joined
        _event(10, "m.room.member", "@m:hs", {"membership": "leave"}, "@m:hs"),
        _event(11, "m.room.member", "@a:hs", {"membership": "invite"}, "@m:hs"),
        # refused: content Synapse's code cannot read (a third-party invite without its signed token)
        _event(12, "m.room.member", "@a:hs", {"membership": "invite", "third_party_invite": {}}, "@n:hs"),
        # refused: an authorising user of a server that did not sign the join (this server's may be named)
        _event(13, "m.room.member", "@j:hs", {"membership": "join", AUTHORISER: "@s:x"}, "@j:hs"),
        _event(14, "m.room.member", "@k:hs", {"membership": "join", AUTHORISER: "@a:hs"}, "@k:hs"),
    ]
    verdict = await run_synapse_judge(python, [{"room_id": "!r:hs", "events": events}])
    assert (verdict.events, verdict.rooms) == (14, 1)
    refused = [(r["event_id"], r["type"]) for r in verdict.refused]
    assert refused == [("$5", "m.room.message"), ("$7", "m.room.power_levels"), ("$9", "m.room.member"),
                       ("$12", "m.room.member"), ("$13", "m.room.member")], str(verdict)  # fmt: skip
