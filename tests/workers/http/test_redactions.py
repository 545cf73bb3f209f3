"""Redactions remove, on in-process workers: a reader that followed the redaction over replication,
and the writer that persisted it, serve the redacted events pruned by the room's version on every
read path (even the bodies they had cached from an earlier sync), and so does the reader after a
restart."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import ClusterClient, RequestRefused, timeline_events

C = "/_matrix/client/v3"
WRITERS = ["p1"]
POWER = "m.room.power_levels"


async def _read_everywhere(
    alice: ClusterClient, via: str, room: str, since: str, redacted: dict[str, str]
) -> list[dict[str, Any]]:
    """Every read path of worker `via`, each event of `redacted` (target -> redaction) as it
    returns it: /event, /messages, /state (and its per-type read), initial and incremental sync."""
    base = f"{alice.urls[via]}{C}/rooms/{room}"
    seen: list[dict[str, Any]] = [await alice._call("GET", f"{base}/event/{target}") for target in redacted]
    chunk = (await alice.messages(room, via=via, dir="b", limit=50))["chunk"]
    state = await alice.room_state(room, via=via)
    initial = await alice.sync(via)
    incremental = await alice.sync(via, since)
    joined = [body["rooms"]["join"][room] for body in (initial, incremental)]
    for events in (chunk, state, *(timeline_events(b) for b in (initial, incremental))):
        seen += [e for e in events if e["event_id"] in redacted]
    seen += [e for j in joined for e in j["state"]["events"] if e["event_id"] in redacted]
    for kind, key in ((POWER, ""), ("m.room.topic", "")):
        content = await alice._call("GET", f"{base}/state/{kind}/{key}")
        seen.append({"type": kind, "content": content, "event_id": "state-read"})
    assert {e["event_id"] for e in seen} >= set(redacted)
    return seen


def _check(seen: list[dict[str, Any]], redacted: dict[str, str], version: str) -> None:
    """Every event pruned as `version` prunes it, naming its redaction."""
    pruned = {
        "m.room.message": {},
        "m.room.topic": {},
        POWER: {"users": {"@alice:localhost": 100}, **({"invite": 7} if version == "11" else {})},
    }
    for event in seen:
        assert event["content"] == pruned[event["type"]], (version, event)
        if event["event_id"] == "state-read":
            continue
        because = event["unsigned"]["redacted_because"]
        assert because["event_id"] == redacted[event["event_id"]] and because["type"] == "m.room.redaction"
        assert because["redacts"] == event["event_id"]  # top-level in every version, for clients
        content = {"reason": "mistake", **({"redacts": event["event_id"]} if version == "11" else {})}
        assert because["content"] == content


@pytest.mark.parametrize("version", ["10", "11"])
async def test_redacted_events_are_pruned_on_every_read_path_of_a_reader_and_after_its_restart(
    make_worker: MakeWorker, http: aiohttp.ClientSession, version: str
) -> None:
    p1, r1 = await make_worker("p1", WRITERS), await make_worker("r1", WRITERS)
    alice = client_for(http, [p1, r1], WRITERS)
    await alice.register("alice", via="r1")
    room = await alice.create_room(via="r1", room_version=version)
    since = (await alice.sync("r1"))["next_batch"]
    message = await alice.send(room, "m.room.message", {"msgtype": "m.text", "body": "oops"}, via="r1")
    topic = await alice.set_state(room, "m.room.topic", "", {"topic": "secret"}, via="r1")
    power = await alice.set_state(
        room,
        POWER,
        "",
        {"users": {"@alice:localhost": 100}, "invite": 7, "notifications": {"room": 0}},
        via="r1",
    )
    targets = [message["event_id"], topic["event_id"], power["event_id"]]
    # Both workers serve them whole (from memory, so their body caches hold them) ...
    for via in ("p1", "r1"):
        served = {e["event_id"]: e for e in timeline_events(await alice.sync(via, since))}
        assert served[message["event_id"]]["content"]["body"] == "oops"
        assert all(served[t]["content"] for t in targets)
    # ... then the writer takes the redactions: r1 hears of them by replication only.
    redacted: dict[str, str] = {}
    for i, target in enumerate(targets):
        url = f"{alice.urls['p1']}{C}/rooms/{room}/redact/{target}/txn{i}"
        redacted[target] = (await alice._call("PUT", url, {"reason": "mistake"}))["event_id"]
    upto, heard = since, set()
    for _ in range(20):
        body = await alice.sync("r1", upto, 2000)
        upto = body["next_batch"]
        heard |= {e["event_id"] for e in timeline_events(body)}
        if set(redacted.values()) <= heard:
            break
    else:
        raise AssertionError("r1 never saw the redactions")
    for via in ("r1", "p1"):
        _check(await _read_everywhere(alice, via, room, since, redacted), redacted, version)
    await r1.stop()
    await make_worker("r1", WRITERS)  # the same port: alice's URL for r1 still holds
    _check(await _read_everywhere(alice, "r1", room, since, redacted), redacted, version)
    # A redaction naming another room's event is refused (400, as Synapse answers) and removes nothing.
    other = await alice.create_room(via="r1", room_version=version)
    kept = await alice.send(other, "m.room.message", {"body": "stays"}, via="r1")
    url = f"{alice.urls['p1']}{C}/rooms/{room}/redact/{kept['event_id']}/cross"
    with pytest.raises(RequestRefused) as cross:
        await alice._call("PUT", url, {"reason": "wrong room"})
    assert cross.value.status == 400, cross.value.body
    event = await alice._call("GET", f"{alice.urls['p1']}{C}/rooms/{other}/event/{kept['event_id']}")
    assert event["content"] == {"body": "stays"} and "redacted_because" not in event["unsigned"]


async def test_a_redacted_power_levels_event_governs_by_what_its_pruning_leaves(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """Version 10 prunes `invite` from power levels: once the event that raised it is redacted,
    the room's invite level is the default again, on the writer that checks the rules."""
    worker = await make_worker("p1", WRITERS)
    alice, bob = client_for(http, [worker], WRITERS), client_for(http, [worker], WRITERS)
    await alice.register("alice")
    await bob.register("bob")
    room = await alice.create_room("public", room_version="10")
    await bob.membership(room, "join")
    raised = await alice.set_state(room, POWER, "", {"users": {alice.user_id: 100}, "invite": 50})
    with pytest.raises(RequestRefused) as refused:
        await bob.membership(room, "invite", "@carol:localhost")
    assert refused.value.status == 403
    await alice.redact(room, raised["event_id"])
    await bob.membership(room, "invite", "@carol:localhost")  # invite is back at its default, 0


async def test_a_rooms_create_event_and_server_acls_are_never_redacted(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """Redacting the create event would prune the room's version from it (rooms 10), and Synapse
    refuses it, as it refuses redacting server ACLs: 403 for the room's creator too."""
    worker = await make_worker("p1", WRITERS)
    alice = client_for(http, [worker], WRITERS)
    await alice.register("alice")
    room = await alice.create_room("public", room_version="10")
    acl = await alice.set_state(room, "m.room.server_acl", "", {"allow": ["*"], "deny": ["evil.example"]})
    state = {(e["type"], e["state_key"]): e for e in await alice.room_state(room)}
    for target in (state[("m.room.create", "")]["event_id"], acl["event_id"]):
        url = f"{alice.urls['p1']}{C}/rooms/{room}/redact/{target}/t-{target[1:9]}"
        with pytest.raises(RequestRefused) as refused:
            await alice._call("PUT", url, {})
        assert (refused.value.status, refused.value.errcode) == (403, "M_FORBIDDEN"), refused.value.body
    state = {(e["type"], e["state_key"]): e for e in await alice.room_state(room)}
    assert state[("m.room.create", "")]["content"]["room_version"] == "10"
    assert state[("m.room.server_acl", "")]["content"]["deny"] == ["evil.example"]
