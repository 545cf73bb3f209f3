"""/sync's Matrix body: the initial sync, the rooms' sections (join, invite, leave), full_state,
filters, and tokens that carry over between workers."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import timeline_events

WRITERS = ["p1", "p2"]
TOP_LEVEL = {"next_batch", "rooms", "presence", "account_data", "to_device", "device_lists",
             "device_one_time_keys_count"}  # fmt: skip


async def test_initial_sync_gives_rooms_with_recent_timeline_state_and_invites(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice, bob = client_for(http, workers, WRITERS), client_for(http, workers, WRITERS, timeline_limit=3)
    await alice.register("alice")
    await bob.register("bob")
    room = await alice.create_room("public", name="Hall")
    secret = await alice.create_room("invite", invite=["@bob:localhost"], name="Den")
    await bob.membership(room, "join")
    for i in range(5):
        await alice.send(room, "m.room.message", {"body": f"m{i}"}, via="r1")  # answered once r1 has it
    body = await bob.sync("r1")  # no since: the initial sync
    assert set(body) >= TOP_LEVEL
    joined = body["rooms"]["join"][room]
    assert [e["content"]["body"] for e in joined["timeline"]["events"]] == ["m2", "m3", "m4"]
    assert joined["timeline"]["limited"] is True and joined["timeline"]["prev_batch"]
    state = {(e["type"], e["state_key"]) for e in joined["state"]["events"]}
    assert {("m.room.create", ""), ("m.room.name", ""), ("m.room.member", "@bob:localhost")} <= state
    assert all(
        "room_id" not in e and e["event_id"] and e["origin_server_ts"] for e in joined["timeline"]["events"]
    )
    invite = body["rooms"]["invite"][secret]["invite_state"]["events"]
    kinds = {(e["type"], e["state_key"]) for e in invite}
    assert ("m.room.name", "") in kinds and ("m.room.member", "@bob:localhost") in kinds
    assert ("m.room.member", "@alice:localhost") not in kinds  # only the invitee's own member event
    assert body["rooms"]["leave"] == {}
    # Joining the invite moves the room to `join`, with its full state, in the next sync.
    await bob.membership(secret, "join")
    later = await bob.sync("r1", body["next_batch"], 2000)
    assert secret in later["rooms"]["join"] and secret not in later["rooms"]["invite"]
    assert ("m.room.name", "") in {
        (e["type"], e["state_key"]) for e in later["rooms"]["join"][secret]["state"]["events"]
    }
    # Leaving puts the room under `leave`, with the leave itself.
    await bob.membership(room, "leave")
    left = await bob.sync("r1", later["next_batch"], 2000)
    assert [e["content"]["membership"] for e in left["rooms"]["leave"][room]["timeline"]["events"]] == [
        "leave"
    ]


async def test_full_state_filters_and_uploaded_filters(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"])
    alice = client_for(http, [worker], ["p1"])
    await alice.register("alice")
    rooms = [await alice.create_room("public") for _ in range(2)]
    since = (await alice.sync("p1"))["next_batch"]
    quiet = await alice.sync("p1", since, 0)
    assert quiet["rooms"]["join"] == {}
    full = await alice.sync("p1", since, 0, full_state="true")
    assert set(full["rooms"]["join"]) == set(rooms)
    assert all(r["state"]["events"] for r in full["rooms"]["join"].values())
    one = {"room": {"rooms": [rooms[0]], "timeline": {"limit": 1}}}
    url = f"{alice.urls['p1']}/_matrix/client/v3/user/@alice:localhost/filter"
    uploaded = await alice._call("POST", url, one)
    assert await alice._call("GET", f"{url}/{uploaded['filter_id']}") == one
    for value in (json.dumps(one), uploaded["filter_id"]):
        await alice.send(rooms[0], "m.room.message", {"body": "a"})
        await alice.send(rooms[0], "m.room.message", {"body": "b"})
        await alice.send(rooms[1], "m.room.message", {"body": "elsewhere"})
        pages: list[list[str]] = []
        while True:  # one event a sync (the filter's limit), only from the filter's room
            result = await alice.sync("p1", since, 0, filter=value)
            since = result["next_batch"]
            if not result["rooms"]["join"]:
                break
            assert list(result["rooms"]["join"]) == [rooms[0]]
            timeline = result["rooms"]["join"][rooms[0]]["timeline"]
            pages.append([e["content"]["body"] for e in timeline["events"]])
        assert pages == [["a"], ["b"]]


async def test_messages_reach_every_member_once_in_order_through_any_worker(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1", "r2")]
    names = [w.name for w in workers]
    users = [client_for(http, workers, WRITERS) for _ in range(3)]
    for i, user in enumerate(users):
        await user.register(f"user{i}")
    room = await users[0].create_room("public")
    for user in users[1:]:
        await user.membership(room, "join")
    tokens = [(await u.sync("r1"))["next_batch"] for u in users]
    sent = [f"{i}-{n}" for n in range(10) for i in range(3)]
    for body in sent:
        await users[int(body.split("-")[0])].send(room, "m.room.message", {"body": body})
    for index, user in enumerate(users):
        got: list[str] = []
        for turn in range(40):
            if len(got) >= len(sent):
                break
            via = (
                names[(turn + index) % len(names)]
                if names[(turn + index) % len(names)].startswith("r")
                else "r2"
            )
            result = await user.sync(via, tokens[index], 1000)
            got += [e["content"]["body"] for e in timeline_events(result) if e["type"] == "m.room.message"]
            tokens[index] = result["next_batch"]
        assert got == sent


async def test_a_long_poll_wakes_on_a_message(make_worker: MakeWorker, http: aiohttp.ClientSession) -> None:
    persister = await make_worker("p1", ["p1"])
    reader = await make_worker("r1", ["p1"])
    alice = client_for(http, [persister, reader], ["p1"])
    await alice.register("alice")
    room = await alice.create_room("public", via="r1")  # answered once r1 has seen the room
    since = (await alice.sync("r1"))["next_batch"]
    poll = asyncio.create_task(alice.sync("r1", since, 20_000))
    await asyncio.sleep(0.3)
    assert not poll.done()
    await alice.send(room, "m.room.message", {"body": "wake"}, via="p1")
    result = await asyncio.wait_for(poll, 10)
    assert [e["content"]["body"] for e in timeline_events(result)] == ["wake"]


async def test_a_since_from_the_future_is_answered_never_refused_and_tokens_never_go_back(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """Ahead of this worker but possible: it waits (bounded) and answers once it has caught up.
    Beyond every sequence (a restored database, a forgery): answered from what exists, counted;
    the client's next token is never below the one it sent."""
    from idgen import SyncToken
    from workers.handlers.sync.handler import SYNC_STREAMS

    persister = await make_worker("p1", ["p1"])
    reader = await make_worker("r1", ["p1"])
    alice = client_for(http, [persister, reader], ["p1"])
    await alice.register("alice")
    room = await alice.create_room("public", via="p1")
    ahead = (await alice.sync("p1"))["next_batch"]  # p1's token: r1 may not have it yet
    result = await alice.sync("r1", ahead, 5000)
    stream = lambda text: SyncToken.parse_ids(text, SYNC_STREAMS)["events"][0]  # noqa: E731
    assert stream(result["next_batch"]) >= stream(ahead)
    await alice.send(room, "m.room.message", {"body": "x"}, via="r1")
    forged = "s900000000000_s900000000000"
    for worker in ("r1", "p1"):
        answer = await alice.sync(worker, forged, 0)
        assert stream(answer["next_batch"]) >= stream(ahead)
    assert reader.registry.get_sample_value("fanout_sync_tokens_clamped_total") >= 1
    # The stream moves on, and a client that kept the clamped token still gets the next events.
    clamped = (await alice.sync("r1", forged, 0))["next_batch"]
    await alice.send(room, "m.room.message", {"body": "after"}, via="r1")
    later = await alice.sync("r1", clamped, 2000)
    assert [e["content"]["body"] for e in timeline_events(later)] == ["after"]


async def test_more_initial_syncs_than_pool_connections_all_answer(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """A reader with cold caches and a pool of 2 answers 6 initial syncs at once: a request never
    waits for a second connection while it holds one (it did: the rooms' history visibility loaded
    inside the initial sync's connection, and 10 syncs on a pool of 10 hung for good)."""
    writer = await make_worker("p1", ["p1"])
    users = []
    for i in range(6):
        user = client_for(http, [writer], ["p1"])
        await user.register(f"crowd{i}")
        await user.create_room("public", name=f"room {i}")
        users.append(user)
    reader = await make_worker("r1", ["p1"], db_pool_size=2)
    answers = await asyncio.wait_for(
        asyncio.gather(
            *(client_for(http, [reader], ["p1"], user_id=u.user_id, token=u.token).sync("r1") for u in users)
        ),
        30,
    )
    assert all(len(a["rooms"]["join"]) == 1 for a in answers)
