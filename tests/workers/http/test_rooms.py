"""Rooms over the Matrix API, on several in-process workers: any worker takes any write, read-your-
writes on the worker that took it, idempotent sends, createRoom's options, state and history."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import RequestRefused, timeline_events
from workers.routing import writer_for_room

WRITERS = ["p1", "p2"]


async def test_any_worker_takes_writes_and_answers_after_it_sees_them(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1", "r2")]
    alice = client_for(http, workers, WRITERS)
    await alice.register("alice", via="r1")
    rooms = [await alice.create_room("public", via=w.name) for w in workers for _ in range(2)]
    assert {writer_for_room(r, WRITERS) for r in rooms} == set(WRITERS)
    for via in ("r1", "r2", "p1", "p2"):
        since = (await alice.sync(via))["next_batch"]
        for room in rooms:
            await alice.send(room, "m.room.message", {"body": f"via {via}"}, via=via)
        # No wait: the answers came after this worker saw each event (read-your-writes).
        events = timeline_events(await alice.sync(via, since, 0))
        assert sum(e["content"].get("body") == f"via {via}" for e in events) == len(rooms), via
    forwarded = sum(w.room_writes.forwarded for w in workers)
    assert forwarded > 0 and sum(w.room_writes.late_answers for w in workers) == 0


async def test_a_retried_send_makes_one_event_even_across_a_persister_restart(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    p1 = await make_worker("p1", ["p1"])
    reader = await make_worker("r1", ["p1"], writer_wait_s=0)  # a stopped persister: 503 at once
    alice = client_for(http, [p1, reader], ["p1"])
    await alice.register("alice", via="r1")
    room = await alice.create_room("public", via="r1")
    first = await alice.send(room, "m.room.message", {"body": "once"}, txn_id="t1", via="r1")

    async def last_stream_id() -> int:
        return int(await reader.pool.fetchval("SELECT last_value FROM events_stream_seq"))

    before = await last_stream_id()
    again = await asyncio.gather(
        *(alice.send(room, "m.room.message", {"body": "once"}, txn_id="t1", via=v) for v in ("r1", "p1") * 5)
    )
    assert {a["event_id"] for a in again} == {first["event_id"]}
    # Answered from the stored event: no stream ID taken, so no gap for any follower.
    assert await last_stream_id() == before
    assert p1.persister is not None and p1.persister.retries_answered > 0
    other = await alice.send(room, "m.room.message", {"body": "twice"}, txn_id="t2", via="r1")
    assert other["event_id"] != first["event_id"]
    assert await last_stream_id() == before + 1
    await p1.stop()
    with pytest.raises(RequestRefused) as down:
        await alice.send(room, "m.room.message", {"body": "once"}, txn_id="t1", via="r1")
    assert (down.value.status, down.value.errcode) == (503, "M_UNKNOWN")
    assert down.value.body["retry_after_ms"] > 0
    await make_worker("p1", ["p1"])  # the persister is back
    before = await last_stream_id()
    retried = await alice.send(room, "m.room.message", {"body": "once"}, txn_id="t1", via="r1")
    assert retried["event_id"] == first["event_id"]
    assert await last_stream_id() == before
    async with reader.pool.acquire() as conn:
        count = await conn.fetchval(
            "SELECT count(*) FROM events WHERE json::jsonb->'content'->>'body' = 'once'"
        )
    assert count == 1


async def test_create_room_options_aliases_and_membership(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice, bob, carol = (client_for(http, workers, WRITERS) for _ in range(3))
    for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
        await client.register(name)
    room = await alice.create_room(
        "invite", via="r1", name="Lobby", topic="hello", invite=["@bob:localhost"], room_alias_name="lobby",
        initial_state=[{"type": "m.room.history_visibility", "content": {"history_visibility": "joined"}}],
    )  # fmt: skip
    state = {(e["type"], e["state_key"]): e for e in await alice.room_state(room, via="r1")}
    assert state[("m.room.create", "")]["content"]["room_version"] == "10"
    assert state[("m.room.name", "")]["content"] == {"name": "Lobby"}
    assert state[("m.room.topic", "")]["content"] == {"topic": "hello"}
    assert state[("m.room.join_rules", "")]["content"] == {"join_rule": "invite"}
    assert state[("m.room.power_levels", "")]["content"]["users"] == {"@alice:localhost": 100}
    assert state[("m.room.member", "@bob:localhost")]["content"]["membership"] == "invite"
    assert state[("m.room.canonical_alias", "")]["content"] == {"alias": "#lobby:localhost"}
    assert all(e["room_id"] == room and e["event_id"] and e["sender"] for e in state.values())
    with pytest.raises(RequestRefused) as taken:
        await carol.create_room("public", room_alias_name="lobby")
    assert taken.value.errcode == "M_ROOM_IN_USE"
    with pytest.raises(RequestRefused) as refused:  # invite-only
        await carol.membership(room, "join")
    assert refused.value.errcode == "M_FORBIDDEN"
    async with http.post(
        f"{bob.urls['p2']}/_matrix/client/v3/join/%23lobby:localhost", json={},
        headers={"Authorization": f"Bearer {bob.token}"},
    ) as resp:  # fmt: skip
        assert resp.status == 200 and (await resp.json()) == {"room_id": room}
    async with http.get(
        f"{bob.urls['r1']}/_matrix/client/v3/joined_rooms", headers={"Authorization": f"Bearer {bob.token}"}
    ) as resp:
        assert (await resp.json()) == {"joined_rooms": [room]}
    await alice.membership(room, "invite", target="carol")
    await carol.membership(room, "join")
    await alice.membership(room, "leave", target="carol")  # kick
    await alice.membership(room, "ban", target="carol")
    with pytest.raises(RequestRefused):
        await carol.membership(room, "join")
    async with http.post(
        f"{alice.urls['r1']}/_matrix/client/v3/rooms/{room}/unban", json={"user_id": "@carol:localhost"},
        headers={"Authorization": f"Bearer {alice.token}"},
    ) as resp:  # fmt: skip
        assert resp.status == 200
    members = await alice._call("GET", f"{alice.urls['r1']}/_matrix/client/v3/rooms/{room}/joined_members")
    assert set(members["joined"]) == {"@alice:localhost", "@bob:localhost"}


async def test_messages_pages_back_through_a_limited_timeline_and_backfill(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice = client_for(http, workers, WRITERS, timeline_limit=5)
    await alice.register("alice")
    room = await alice.create_room("public", via="r1")
    since = (await alice.sync("r1"))["next_batch"]
    for i in range(23):
        await alice.send(room, "m.room.message", {"n": i}, via="r1")
    await alice.set_state(room, "m.room.topic", "", {"topic": "late"}, via="r1")
    await alice.send(room, "m.room.message", {"n": 23}, via="r1")
    # An incremental sync pages instead of leaving a gap: five at a time, none limited.
    pages: list[list[int | None]] = []
    while True:
        result = await alice.sync("r1", since, 0)
        since = result["next_batch"]
        if room not in result["rooms"]["join"]:
            break
        timeline = result["rooms"]["join"][room]["timeline"]
        assert timeline["limited"] is False and len(timeline["events"]) <= 5
        pages.append([e["content"].get("n") for e in timeline["events"]])
    assert [n for page in pages for n in page] == [*range(23), None, 23] and len(pages) == 5
    # An initial sync shows the recent five, limited, and /messages pages back from prev_batch.
    result = await alice.sync("r1")
    timeline = result["rooms"]["join"][room]["timeline"]
    assert timeline["limited"] is True and len(timeline["events"]) == 5
    assert timeline["events"][-1]["content"] == {"n": 23}
    # Paging back from prev_batch fills the gap, without repeats, in reverse order.
    seen: list[int] = []
    token = timeline["prev_batch"]
    while True:
        page = await alice.messages(room, via="r1", dir="b", limit=4, **{"from": token})
        seen += [e["content"]["n"] for e in page["chunk"] if e["type"] == "m.room.message"]
        if "end" not in page or (seen and seen[-1] == 0):
            break
        token = page["end"]
    assert [e["content"].get("n") for e in timeline["events"]] == [20, 21, 22, None, 23]
    assert seen == list(range(19, -1, -1))
    # Forwards from the start, and backfilled history, older than everything live.
    await alice.backfill(room, [{"type": "m.room.message", "content": {"old": i}} for i in range(3)])
    page = await alice.messages(room, via="p2", dir="f", limit=3)
    assert [e["content"] for e in page["chunk"]] == [{"old": 2}, {"old": 1}, {"old": 0}]
    async with http.get(
        f"{alice.urls['r1']}/_matrix/client/v3/rooms/{room}/messages?dir=b&from=garbage",
        headers={"Authorization": f"Bearer {alice.token}"},
    ) as resp:
        assert resp.status == 400 and (await resp.json())["errcode"] == "M_INVALID_PARAM"


async def test_power_levels_decide_who_may_kick_ban_and_change_state(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """The spec's default levels: the creator 100, members 0; kick, ban and state at 50."""
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice, bob, carol = (client_for(http, workers, WRITERS) for _ in range(3))
    for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
        await client.register(name)
    room = await alice.create_room("public")
    await bob.membership(room, "join")
    await carol.membership(room, "join")
    refused = [
        bob.membership(room, "ban", target="alice"),  # a member bans the creator
        bob.membership(room, "leave", target="carol"),  # kick
        bob.set_state(room, "m.room.name", "", {"name": "mine"}),
        bob.set_state(room, "m.room.power_levels", "", {"users": {"@bob:localhost": 100}}),
    ]
    for attempt in refused:
        with pytest.raises(RequestRefused) as no:
            await attempt
        assert (no.value.status, no.value.errcode) == (403, "M_FORBIDDEN"), no.value.body
    await bob.send(room, "m.room.message", {"body": "messages need power 0"})
    # The creator raises bob to moderator: now he may kick carol, but still not touch alice.
    levels = {e["type"]: e for e in await alice.room_state(room, via="r1")}["m.room.power_levels"]["content"]
    await alice.set_state(
        room,
        "m.room.power_levels",
        "",
        {**levels, "users": {**levels["users"], "@bob:localhost": 50}},
        via="r1",
    )
    await bob.membership(room, "leave", target="carol", via="r1")
    with pytest.raises(RequestRefused):
        await bob.membership(room, "ban", target="alice", via="r1")
    with pytest.raises(RequestRefused):  # a moderator cannot grant more than it has
        await bob.set_state(room, "m.room.power_levels", "", {**levels, "users": {"@bob:localhost": 100}})
    with pytest.raises(RequestRefused) as stringy:  # rooms 10 and 11 take integer levels only
        await alice.set_state(room, "m.room.power_levels", "", {**levels, "ban": "50"}, via="r1")
    assert (stringy.value.status, stringy.value.errcode) == (400, "M_BAD_JSON"), stringy.value.body
    await alice.membership(room, "ban", target="bob", via="r1")
    state = {(e["type"], e["state_key"]): e for e in await alice.room_state(room, via="r1")}
    assert state[("m.room.member", "@bob:localhost")]["content"]["membership"] == "ban"
    assert state[("m.room.member", "@carol:localhost")]["content"]["membership"] == "leave"


async def test_a_second_create_event_and_an_event_over_the_size_limit_are_refused(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """Events the spec's rules refuse whatever the sender's power: a second m.room.create (400
    M_INVALID_PARAM, as Synapse answers: "Cannot resend m.room.create event"), and an event over
    65,536 bytes in the federation format though its body is within the request limit (413
    M_TOO_LARGE); the room goes on as it was."""
    worker = await make_worker("p1", ["p1"])
    alice = client_for(http, [worker], ["p1"])
    await alice.register("alice")
    room = await alice.create_room("public")
    with pytest.raises(RequestRefused) as create:
        await alice.set_state(
            room, "m.room.create", "", {"creator": "@alice:localhost", "room_version": "11"}
        )
    assert (create.value.status, create.value.errcode) == (400, "M_INVALID_PARAM"), create.value.body
    with pytest.raises(RequestRefused) as large:
        await alice.send(room, "m.room.message", {"body": "x" * 65_000})
    assert (large.value.status, large.value.errcode) == (413, "M_TOO_LARGE"), large.value.body
    await alice.send(room, "m.room.message", {"body": "x" * 60_000})
    state = {(e["type"], e["state_key"]): e for e in await alice.room_state(room)}
    assert state[("m.room.create", "")]["content"]["room_version"] == "10"


async def test_a_forwarded_send_with_a_malformed_expectation_is_400_and_stores_nothing(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """The owner's side of a forwarded /kick or /unban: `target_was` that is not a list of
    memberships is 400 M_INVALID_PARAM (one line, no traceback), and nothing is written."""
    worker = await make_worker("p1", ["p1"])
    alice, bob = client_for(http, [worker], ["p1"]), client_for(http, [worker], ["p1"])
    await alice.register("alice")
    await bob.register("bob")
    room = await alice.create_room("public")
    await bob.membership(room, "join")
    kick = {
        "event_id": "$forwarded-kick", "room_id": room, "type": "m.room.member", "sender": "@alice:localhost",
        "content": {"membership": "leave"}, "state_key": "@bob:localhost",
    }  # fmt: skip
    url = f"http://127.0.0.1:{worker.http_port}/_fanout/internal/rooms/{room}/send"
    headers = {"Authorization": "Bearer test-worker-secret-0123456789"}
    for target_was in ("join", [1], {"join": True}):
        body = {"event": kick, "txn": False, "target_was": target_was}
        async with http.post(url, json=body, headers=headers) as resp:
            assert resp.status == 400, await resp.text()
            assert (await resp.json())["errcode"] == "M_INVALID_PARAM"

    async def bob_is() -> str:
        state = {(e["type"], e["state_key"]): e for e in await alice.room_state(room)}
        return str(state[("m.room.member", "@bob:localhost")]["content"]["membership"])

    assert await bob_is() == "join"
    async with http.post(url, json={"event": kick, "target_was": ["join"]}, headers=headers) as resp:
        assert resp.status == 200, await resp.text()  # the same body, well formed: the kick is done
    assert await bob_is() == "leave"


async def test_a_member_event_from_a_client_never_names_an_authoriser(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """`join_authorised_via_users_server` is added by the authorising server, which signs the event
    (rule 4.2 of rooms 8 and later): from a client it is dropped, whoever it names, as Synapse
    drops it (a client copies it from an earlier member event to change a display name), and the
    join is stored without it. A display name over 256 characters is 400, as in Synapse."""
    worker = await make_worker("p1", ["p1"])
    alice, bob = client_for(http, [worker], ["p1"]), client_for(http, [worker], ["p1"])
    await alice.register("alice")
    await bob.register("bob")
    room = await alice.create_room("public")
    for named in ("@admin:elsewhere.example", 7, "@alice:localhost"):
        content = {"membership": "join", "displayname": "Bob", "join_authorised_via_users_server": named}
        await bob.set_state(room, "m.room.member", "@bob:localhost", content)
        state = {(e["type"], e["state_key"]): e for e in await alice.room_state(room)}
        assert state[("m.room.member", "@bob:localhost")]["content"] == {
            "membership": "join",
            "displayname": "Bob",
        }
    with pytest.raises(RequestRefused) as long_name:
        await bob.set_state(
            room, "m.room.member", "@bob:localhost", {"membership": "join", "displayname": "b" * 257}
        )
    assert (long_name.value.status, long_name.value.errcode) == (400, "M_BAD_JSON"), long_name.value.body


async def test_a_repeated_membership_is_answered_with_the_stored_event(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """As Synapse answers: a membership request that repeats the target's member event (the same
    sender, membership and content) is 200 and stores nothing, two racing through two workers
    included; a kick repeats too, an unban of a user no longer banned is 403."""
    workers = [await make_worker(n, WRITERS) for n in WRITERS]
    alice, bob = client_for(http, workers, WRITERS), client_for(http, workers, WRITERS)
    await alice.register("alice")
    await bob.register("bob")
    room = await alice.create_room("public")
    bob_id = str(bob.user_id)
    await asyncio.gather(*(bob.membership(room, "join", via=w) for w in WRITERS))
    await bob.membership(room, "join")
    for _ in range(2):
        await bob.membership(room, "leave")
    for op in ("invite", "invite", "leave", "leave", "ban", "ban"):
        await alice.membership(room, op, target=bob_id)
    await alice.set_state(room, "m.room.member", bob_id, {"membership": "ban", "reason": "spam"})
    await alice.membership(room, "unban", target=bob_id)
    with pytest.raises(RequestRefused) as again:
        await alice.membership(room, "unban", target=bob_id)
    assert again.value.status == 403, again.value.body
    history = await alice.messages(room, dir="b", limit=100)
    bobs = [
        e for e in reversed(history["chunk"]) if e["type"] == "m.room.member" and e["state_key"] == bob_id
    ]
    assert [(e["sender"], e["content"]["membership"]) for e in bobs] == [
        (bob_id, "join"), (bob_id, "leave"),
        (str(alice.user_id), "invite"), (str(alice.user_id), "leave"),
        (str(alice.user_id), "ban"), (str(alice.user_id), "ban"), (str(alice.user_id), "leave"),
    ]  # fmt: skip


async def test_content_the_server_reads_is_refused_out_of_form(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """A server ACL that denies this server, malformed mentions, a retention policy that is not
    integers: 400 as Synapse's validator answers, at createRoom too, and nothing is stored."""
    worker = await make_worker("p1", ["p1"])
    alice = client_for(http, [worker], ["p1"])
    await alice.register("alice")
    room = await alice.create_room("public")
    refused = [
        alice.set_state(room, "m.room.server_acl", "", {"allow": ["*"], "deny": ["localhost"]}),
        alice.set_state(room, "m.room.server_acl", "", {"allow": ["elsewhere.example"]}),
        alice.send(room, "m.room.message", {"body": "hi", "m.mentions": {"user_ids": "@bob:localhost"}}),
        alice.set_state(room, "m.room.retention", "", {"max_lifetime": "1d"}),
        alice.create_room(
            "public",
            initial_state=[{"type": "m.room.server_acl", "state_key": "", "content": {"deny": ["*"]}}],
        ),
    ]
    for request in refused:
        with pytest.raises(RequestRefused) as bad:
            await request
        assert (bad.value.status, bad.value.errcode) == (400, "M_BAD_JSON"), bad.value.body
    before = await alice.room_state(room)
    assert not any(e["type"] in ("m.room.server_acl", "m.room.retention") for e in before)
    await alice.set_state(room, "m.room.server_acl", "", {"allow": ["*"], "deny": ["evil.example"]})
    await alice.send(room, "m.room.message", {"body": "hi", "m.mentions": {"user_ids": ["@alice:localhost"]}})
    state = {(e["type"], e["state_key"]): e for e in await alice.room_state(room)}
    assert state[("m.room.server_acl", "")]["content"]["deny"] == ["evil.example"]


async def test_a_create_room_whose_events_the_rules_refuse_writes_nothing(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """A power levels override that leaves the creator below what createRoom's later events need
    is a 403 (as Synapse answers), and no room is written; the creator's rooms stay as they were."""
    worker = await make_worker("p1", ["p1"])
    alice = client_for(http, [worker], ["p1"])
    await alice.register("alice")
    with pytest.raises(RequestRefused) as refused:
        await alice.create_room("public", power_level_content_override={"state_default": 101})
    assert (refused.value.status, refused.value.errcode) == (403, "M_FORBIDDEN"), refused.value.body
    joined = await alice._call("GET", f"{alice.urls['p1']}/_matrix/client/v3/joined_rooms")
    assert joined == {"joined_rooms": []}
    room = await alice.create_room("public", power_level_content_override={"state_default": 100})
    assert (await alice._call("GET", f"{alice.urls['p1']}/_matrix/client/v3/joined_rooms")) == {
        "joined_rooms": [room]
    }


async def test_backfill_takes_what_the_member_may_send_and_canonical_json_only(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """Imported history is held to what the member may send now (a member below the room's
    events level imports nothing: 403) and to what every event is (canonical JSON: 400)."""
    worker = await make_worker("p1", ["p1"])
    alice, bob = client_for(http, [worker], ["p1"]), client_for(http, [worker], ["p1"])
    await alice.register("alice")
    await bob.register("bob")
    room = await alice.create_room("public", power_level_content_override={"events_default": 10})
    await bob.membership(room, "join")
    with pytest.raises(RequestRefused) as muted:
        await bob.backfill(room, [{"type": "m.room.message", "content": {"body": "old"}}])
    assert (muted.value.status, muted.value.errcode) == (403, "M_FORBIDDEN"), muted.value.body
    with pytest.raises(RequestRefused) as floats:
        await alice.backfill(room, [{"type": "m.room.message", "content": {"n": 0.5}}])
    assert (floats.value.status, floats.value.errcode) == (400, "M_BAD_JSON"), floats.value.body
    assert len(await alice.backfill(room, [{"type": "m.room.message", "content": {"body": "old"}}])) == 1


async def test_a_kick_never_lifts_a_ban_and_an_unban_never_kicks(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """`/kick` acts on a member, an invitee or a knocker and `/unban` on a banned user, as the room's
    writer sees the target when the change is checked (403 otherwise, M_BAD_STATE where Synapse
    answers it: an unban of a user who is not banned, a banned user kicked, invited or joining). The
    rules alone would take a kick of a banned user as an unban: a kick that lands just after a ban
    would lift it."""
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice, bob = client_for(http, workers, WRITERS), client_for(http, workers, WRITERS)
    await alice.register("alice")
    await bob.register("bob")
    room = await alice.create_room("public")
    await bob.membership(room, "join")
    with pytest.raises(RequestRefused) as not_banned:
        await alice.membership(room, "unban", target="bob", via="r1")
    assert (not_banned.value.status, not_banned.value.errcode) == (403, "M_BAD_STATE"), not_banned.value.body
    await alice.membership(room, "ban", target="bob")
    with pytest.raises(RequestRefused) as banned:
        await alice.membership(room, "leave", target="bob", via="r1")  # /kick
    assert (banned.value.status, banned.value.errcode) == (403, "M_BAD_STATE"), banned.value.body
    for op, who in (("invite", alice), ("join", bob)):  # a banned user invited or joining
        with pytest.raises(RequestRefused) as refused:
            await who.membership(room, op, target="bob" if who is alice else None, via="r1")
        assert (refused.value.status, refused.value.errcode) == (403, "M_BAD_STATE"), refused.value.body

    async def bob_is() -> str:
        state = {(e["type"], e["state_key"]): e for e in await alice.room_state(room)}
        return str(state[("m.room.member", "@bob:localhost")]["content"]["membership"])

    assert await bob_is() == "ban"
    await alice.membership(room, "unban", target="bob", via="r1")
    assert await bob_is() == "leave"
    await alice.membership(room, "leave", target="bob")  # the unban's event again: a repeat (as Synapse)
    assert await bob_is() == "leave"
    await bob.membership(room, "join")
    await bob.membership(room, "leave")
    with pytest.raises(RequestRefused) as gone:  # nobody to kick: bob left
        await alice.membership(room, "leave", target="bob")
    assert (gone.value.status, gone.value.errcode) == (403, "M_FORBIDDEN"), gone.value.body


async def test_one_event_and_profiles_answer_only_what_the_requester_may_see(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"])
    alice, mallory = client_for(http, [worker], ["p1"]), client_for(http, [worker], ["p1"])
    await alice.register("alice")
    await mallory.register("mallory")
    room = await alice.create_room("invite")
    sent = await alice.send(room, "m.room.message", {"body": "mine"})
    url = f"{alice.urls['p1']}/_matrix/client/v3/rooms/{room}/event/{sent['event_id']}"
    assert (await alice._call("GET", url))["content"] == {"body": "mine"}
    with pytest.raises(RequestRefused) as hidden:
        await mallory._call("GET", url)
    assert (hidden.value.status, hidden.value.errcode) == (404, "M_NOT_FOUND")
    profile = f"{alice.urls['p1']}/_matrix/client/v3/profile"
    assert await mallory._call("GET", f"{profile}/@alice:localhost") == {}
    for missing in ("@nobody:localhost", "@alice:localhost/displayname"):
        with pytest.raises(RequestRefused) as absent:
            await mallory._call("GET", f"{profile}/{missing}")
        assert absent.value.errcode == "M_NOT_FOUND"
