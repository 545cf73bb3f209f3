"""Account data, room tags, devices, device lists and to-device messages over the Matrix API,
with the writes forwarded to the user's writer and the reads on another worker's /sync."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.storage import account_data as account_store
from workers.streams.account_data import AccountDataRow, account_data_stream

WRITERS = ["p1", "p2"]
C = "/_matrix/client/v3"


async def refused(call: Any) -> tuple[int, str | None]:
    try:
        await call
    except RequestRefused as e:
        return e.status, e.errcode
    raise AssertionError("the request was not refused")


async def sync_until(
    client: ClusterClient, via: str, since: str, done: Any, rounds: int = 20
) -> tuple[list[dict[str, Any]], str]:
    """Syncs from `since` until `done(bodies)`; (the bodies, the last next_batch)."""
    bodies: list[dict[str, Any]] = []
    for _ in range(rounds):
        body = await client.sync(via, since, 2000)
        bodies.append(body)
        since = body["next_batch"]
        if done(bodies):
            return bodies, since
    raise AssertionError(f"not done after {rounds} syncs: {bodies[-3:]}")


async def test_account_data_and_tags_from_any_worker_reach_sync_once_in_order(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice, bob = client_for(http, workers, WRITERS), client_for(http, workers, WRITERS)
    await alice.register("alice", via="r1")
    await bob.register("bob", via="r1")
    room = await alice.create_room("public")
    first = await alice.sync("r1")
    for n in range(5):  # from every worker: each write goes to alice's writer
        await alice.put_account_data(f"io.test.n{n}", {"n": n}, via=("p1", "p2", "r1")[n % 3])
    await alice.put_account_data("io.test.room", {"x": 1}, room_id=room, via="r1")
    await alice.set_tag(room, "m.favourite", {"order": 0.5}, via="p2")
    # Read-your-writes: the answer came once r1 had the write, so r1 shows it at once.
    url = f"{alice.urls['r1']}{C}/user/{alice.user_id}/account_data/io.test.n4"
    assert await alice._call("GET", url) == {"n": 4}
    seen: list[str] = []
    room_data: list[dict[str, Any]] = []

    def collect(bodies: list[dict[str, Any]]) -> bool:
        body = bodies[-1]
        seen.extend(e["type"] for e in body["account_data"]["events"])
        room_data.extend(body["rooms"]["join"].get(room, {}).get("account_data", {}).get("events", []))
        return len(seen) >= 5 and len(room_data) >= 2

    _, since = await sync_until(alice, "r1", first["next_batch"], collect)
    assert seen == [f"io.test.n{n}" for n in range(5)]  # once each, in the order written
    assert {e["type"] for e in room_data} == {"io.test.room", "m.tag"}
    assert next(e for e in room_data if e["type"] == "m.tag")["content"] == {
        "tags": {"m.favourite": {"order": 0.5}}
    }
    # Removing the tag is a change too; an untouched type does not come back.
    await alice.set_tag(room, "m.favourite", None, via="r1")
    later = await alice.sync("r1", since, 2000)
    assert later["account_data"]["events"] == []
    assert later["rooms"]["join"][room]["account_data"]["events"] == [
        {"type": "m.tag", "content": {"tags": {}}}
    ]
    tags = await alice._call("GET", f"{alice.urls['p1']}{C}/user/{alice.user_id}/rooms/{room}/tags")
    assert tags == {"tags": {}}
    # An initial sync carries all of it; bob sees none of alice's.
    everything = await alice.sync("p2")
    assert {e["type"] for e in everything["account_data"]["events"]} == {f"io.test.n{n}" for n in range(5)}
    assert (await bob.sync("r1"))["account_data"]["events"] == []
    # The spec's refusals.
    other = f"{bob.urls['r1']}{C}/user/{alice.user_id}/account_data/io.test.n1"
    assert await refused(bob._call("GET", other)) == (403, "M_FORBIDDEN")
    assert await refused(bob._call("PUT", other, {})) == (403, "M_FORBIDDEN")
    mine = f"{bob.urls['r1']}{C}/user/{bob.user_id}/account_data"
    assert await refused(bob._call("GET", f"{mine}/io.test.none")) == (404, "M_NOT_FOUND")
    assert await refused(bob._call("PUT", f"{mine}/m.push_rules", {})) == (405, "M_BAD_JSON")
    fully_read = f"{bob.urls['r1']}{C}/user/{bob.user_id}/rooms/{room}/account_data/m.fully_read"
    assert await refused(bob._call("PUT", fully_read, {})) == (405, "M_BAD_JSON")
    tag = f"{bob.urls['r1']}{C}/user/{bob.user_id}/rooms/{room}/tags/t"
    assert await refused(bob._call("PUT", tag, {"order": "first"})) == (400, "M_BAD_JSON")


async def test_the_merge_of_three_tables_orders_by_stream_id_only(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """Synapse once merged its account-data sources with a tuple sort, which compared a room id
    with None when two sources held the same stream id. Equal ids across our tables (only a
    hand-made database has them) still come back merged by id, every row once."""
    worker = await make_worker("p1", ["p1"])
    async with worker.pool.acquire() as conn:
        await account_store.put_global(conn, "@u:localhost", "a.global", {}, 7, "p1")
        await account_store.put_room(conn, "@u:localhost", "!r:localhost", "a.room", {}, 7, "p1")
        await account_store.set_tag(conn, "@u:localhost", "!r:localhost", "t", {}, 7, "p1")
        await account_store.put_global(conn, "@u:localhost", "b.global", {}, 6, "p1")
    stream = account_data_stream(worker.pool, worker.generators["account_data"], ["p1"])
    rows = await stream.update_function("p1", 5, 7, 10)
    assert [token for token, _ in rows] == [6, 7, 7, 7]
    assert sorted(rows[1:], key=lambda r: str(r[1].room_id)) == sorted(
        [
            (7, AccountDataRow("@u:localhost", None, "a.global")),
            (7, AccountDataRow("@u:localhost", "!r:localhost", "a.room")),
            (7, AccountDataRow("@u:localhost", "!r:localhost", "m.tag")),
        ],
        key=lambda r: str(r[1].room_id),
    )
    # A page that ends inside the rows of id 7 is completed by the next one (catch-up's rule).
    assert len(await stream.update_function("p1", 5, 7, 2)) == 2


async def test_to_device_goes_to_exactly_that_device_once_and_is_deleted_when_acknowledged(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice = client_for(http, workers, WRITERS)
    bob_phone, bob_laptop = client_for(http, workers, WRITERS), client_for(http, workers, WRITERS)
    await alice.register("alice", via="r1")
    await bob_phone.register("bob", via="r1")
    login = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "bob"},
             "password": "fanout-harness-password", "device_id": "LAPTOP"}  # fmt: skip
    session = await bob_laptop._call("POST", f"{bob_laptop.urls['p2']}{C}/login", login)
    bob_laptop.user_id, bob_laptop.token, bob_laptop.device_id = (
        "@bob:localhost",
        session["access_token"],
        "LAPTOP",
    )
    phone_since = (await bob_phone.sync("r1"))["next_batch"]
    laptop_since = (await bob_laptop.sync("r1"))["next_batch"]
    bob = "@bob:localhost"
    await alice.send_to_device("io.test.ping", {bob: {"LAPTOP": {"n": 1}}}, txn_id="t1", via="r1")
    await alice.send_to_device("io.test.ping", {bob: {"LAPTOP": {"n": 1}}}, txn_id="t1", via="p1")  # a retry
    await alice.send_to_device("io.test.ping", {bob: {"*": {"n": 2}}}, txn_id="t2", via="p2")
    await alice.send_to_device("io.test.ping", {bob: {"*": {"n": 3}, "LAPTOP": {"n": 33}}}, txn_id="t3")

    async def received(client: ClusterClient, since: str, count: int) -> tuple[list[Any], str]:
        got: list[Any] = []

        def enough(bodies: list[dict[str, Any]]) -> bool:
            got.extend(bodies[-1]["to_device"]["events"])
            return len(got) >= count

        _, since = await sync_until(client, "r1", since, enough)
        return got, since

    laptop, laptop_since = await received(bob_laptop, laptop_since, 3)
    phone, phone_since = await received(bob_phone, phone_since, 2)
    assert [e["content"]["n"] for e in laptop] == [1, 2, 33]  # the retry sent nothing twice
    assert [e["content"]["n"] for e in phone] == [2, 3]
    assert all(e["sender"] == "@alice:localhost" and e["type"] == "io.test.ping" for e in laptop + phone)
    async with workers[0].pool.acquire() as conn:
        waiting = await conn.fetchval("SELECT count(*) FROM device_inbox WHERE user_id = $1", bob)
    assert 0 < waiting <= 5  # what the last syncs delivered is kept until a later since acknowledges it
    # The next sync acknowledges them: deleted, and never sent again.
    again = await bob_laptop.sync("r1", laptop_since, 0)
    assert again["to_device"]["events"] == []
    await bob_phone.sync("p1", phone_since, 0)  # acknowledged on another worker: deleted there
    async with workers[0].pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM device_inbox WHERE user_id = $1", bob) == 0
    # More than one sync carries: the next ones continue where the last stopped.
    for n in range(130):
        await alice.send_to_device("io.test.bulk", {bob: {"LAPTOP": {"n": n}}})
    bulk, _ = await received(bob_laptop, again["next_batch"], 130)
    assert [e["content"]["n"] for e in bulk] == list(range(130))


async def test_device_changes_reach_room_mates_and_keys_follow(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice, bob, carol = (client_for(http, workers, WRITERS) for _ in range(3))
    for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
        await client.register(name, via="r1")
    room = await alice.create_room("public")
    await bob.membership(room, "join")
    since = (await alice.sync("r1"))["next_batch"]
    carol_since = (await carol.sync("r1"))["next_batch"]
    keys = {"algorithms": ["m.olm.v1.curve25519-aes-sha2"], "keys": {f"ed25519:{bob.device_id}": "k1"}}
    await bob.upload_keys(keys, via="p2")
    _, since = await sync_until(
        alice, "r1", since, lambda b: "@bob:localhost" in b[-1]["device_lists"]["changed"]
    )
    query = {"device_keys": {"@bob:localhost": []}}
    found = await alice._call("POST", f"{alice.urls['r1']}{C}/keys/query", query)
    assert found["device_keys"]["@bob:localhost"][bob.device_id]["keys"] == keys["keys"]
    # carol shares no room with bob: nothing for her.
    assert (await carol.sync("r1", carol_since, 500))["device_lists"]["changed"] == []
    # Renaming and deleting a device are changes too; deleting needs the password.
    devices = await bob._call("GET", f"{bob.urls['r1']}{C}/devices")
    assert [d["device_id"] for d in devices["devices"]] == [bob.device_id]
    await bob._call("PUT", f"{bob.urls['p1']}{C}/devices/{bob.device_id}", {"display_name": "phone"})
    _, since = await sync_until(
        alice, "r1", since, lambda b: "@bob:localhost" in b[-1]["device_lists"]["changed"]
    )
    delete = f"{bob.urls['r1']}{C}/devices/{bob.device_id}"
    assert await refused(bob._call("DELETE", delete, {})) == (401, "M_UNAUTHORIZED")
    wrong = {"auth": {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "bob"},
                      "password": "wrong"}}  # fmt: skip
    assert await refused(bob._call("DELETE", delete, wrong)) == (401, "M_FORBIDDEN")
    # carol joins the room: bob becomes new to her (changed); bob leaves: left.
    await carol.membership(room, "join")
    _, carol_since = await sync_until(
        carol, "r1", carol_since, lambda b: "@bob:localhost" in b[-1]["device_lists"]["changed"]
    )
    await bob.membership(room, "leave")
    await sync_until(carol, "r1", carol_since, lambda b: "@bob:localhost" in b[-1]["device_lists"]["left"])
    right = {"auth": {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "bob"},
                      "password": "fanout-harness-password"}}  # fmt: skip
    await bob._call("DELETE", delete, right)
    assert await refused(bob._call("GET", f"{bob.urls['r1']}{C}/account/whoami")) == (401, "M_UNKNOWN_TOKEN")


async def test_room_versions_render_on_readers_and_a_remote_invite_is_kept_for_later(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS, default_room_version="11") for n in ("p1", "p2", "r1")]
    alice = client_for(http, workers, WRITERS)
    await alice.register("alice", via="r1")
    caps = await alice._call("GET", f"{alice.urls['r1']}{C}/capabilities")
    assert caps["capabilities"]["m.room_versions"]["default"] == "11"
    assert await refused(alice.create_room(room_version="99")) == (400, "M_UNSUPPORTED_ROOM_VERSION")
    v10, v11 = await alice.create_room(room_version="10"), await alice.create_room()
    for room in (v10, v11):
        sent = await alice.send(room, "m.room.message", {"body": "oops"}, via="r1")
        url = f"{alice.urls['r1']}{C}/rooms/{room}/redact/{sent['event_id']}/txn1"
        redaction = await alice._call("PUT", url, {"reason": "typo"})
        event = await alice._call("GET", f"{alice.urls['r1']}{C}/rooms/{room}/event/{redaction['event_id']}")
        assert event["redacts"] == sent["event_id"]
        if room == v10:  # before version 11: at the top of the event only
            assert event["content"] == {"reason": "typo"}
        else:
            assert event["content"] == {"redacts": sent["event_id"], "reason": "typo"}
    async with workers[2].pool.acquire() as conn:
        stored = dict(await conn.fetch("SELECT room_id, room_version FROM rooms"))
    assert stored == {v10: "10", v11: "11"}

    # A remote server's invite: refused without the cluster's secret and for a version we lack.
    invite_url = f"{alice.urls['r1']}/_matrix/federation/v2/invite/!far:remote.test/$inv1"
    event = {"type": "m.room.member", "sender": "@zed:remote.test", "state_key": "@alice:localhost",
             "content": {"membership": "invite"}}  # fmt: skip
    name = {"type": "m.room.name", "state_key": "", "content": {"name": "Far"}}
    body = {"room_version": "11", "event": event, "invite_room_state": [name]}
    assert await refused(alice._call("PUT", invite_url, body)) == (401, "M_UNAUTHORIZED")
    peer = ClusterClient(http, alice.urls, token="test-worker-secret-0123456789")
    old = {**body, "room_version": "2"}
    assert await refused(peer._call("PUT", invite_url, old)) == (400, "M_INCOMPATIBLE_ROOM_VERSION")
    since = (await alice.sync("r1"))["next_batch"]
    await peer._call("PUT", invite_url, body)
    bodies, since = await sync_until(
        alice, "r1", since, lambda b: "!far:remote.test" in b[-1]["rooms"]["invite"]
    )
    shown = bodies[-1]["rooms"]["invite"]["!far:remote.test"]["invite_state"]["events"]
    assert {(e["type"], e.get("content", {}).get("name")) for e in shown} >= {("m.room.name", "Far")}
    # Accepted later: the join is checked against the version the invite named.
    await alice.membership("!far:remote.test", "join", via="p2")
    await sync_until(alice, "r1", since, lambda b: "!far:remote.test" in b[-1]["rooms"]["join"])
    await asyncio.sleep(0)
