"""Forgetting rooms and read markers over the Matrix API, on several in-process workers."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp

from tests.workers.conftest import MakeWorker, client_for
from tests.workers.http.test_stored_streams import refused, sync_until
from workers.app import Worker
from workers.harness.cluster_client import ClusterClient
from workers.storage import forgotten_rooms

WRITERS = ["p1", "p2"]
C = "/_matrix/client/v3"


async def forget(client: ClusterClient, room: str, via: str) -> Any:
    return await client._call("POST", f"{client.urls[via]}{C}/rooms/{quote(room)}/forget", {})


async def forgotten_on(worker: Worker, user_id: str) -> set[str]:
    """What /sync on `worker` would leave out of the user's `rooms.leave` now."""
    async with worker.pool.acquire() as conn:
        return await forgotten_rooms.forgotten_rooms(
            conn, user_id, await worker.caches.rooms_for_user.get(user_id)
        )


async def test_forget_only_after_leaving_and_until_a_new_membership(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    reader = workers[2]
    alice, bob, carol = (client_for(http, workers, WRITERS) for _ in range(3))
    for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
        await client.register(name, via="r1")
    assert bob.user_id and carol.user_id
    room = await alice.create_room("public", via="p1")
    await bob.membership(room, "join", via="p2")
    assert await refused(forget(bob, room, "r1")) == (400, "M_UNKNOWN")  # joined
    await alice.membership(room, "invite", "carol")
    assert await refused(forget(carol, room, "r1")) == (400, "M_UNKNOWN")  # invited
    since = (await bob.sync("r1"))["next_batch"]
    await bob.membership(room, "leave", via="p1")
    assert await forget(bob, room, "r1") == {}
    assert await forget(bob, room, "p2") == {}  # again: still fine
    await sync_until(bob, "r1", since, lambda b: room in b[-1]["rooms"]["leave"])
    assert await forgotten_on(reader, bob.user_id) == {room}
    # A new membership shows the room again: the forget was of the leave.
    await bob.membership(room, "join", via="r1")
    assert await forgotten_on(reader, bob.user_id) == set()
    # Banned: forgettable too. A room one never was in: nothing to forget, no error.
    await alice.membership(room, "ban", "bob", via="r1")
    assert await forget(bob, room, "p1") == {}
    assert await forget(carol, "!nosuch:localhost", "r1") == {}
    assert await refused(forget(carol, "not-a-room", "r1")) == (400, "M_INVALID_PARAM")
    async with reader.pool.acquire() as conn:
        assert (
            await conn.fetchval("SELECT count(*) FROM forgotten_rooms WHERE user_id = $1", carol.user_id) == 0
        )


async def test_read_markers_set_fully_read_in_the_rooms_account_data(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice = client_for(http, workers, WRITERS)
    await alice.register("alice", via="r1")
    room = await alice.create_room("public", via="p1")
    sent = await alice.send(room, "m.room.message", {"body": "hi"}, via="p2")
    since = (await alice.sync("r1"))["next_batch"]
    markers = f"{alice.urls['p2']}{C}/rooms/{quote(room)}/read_markers"
    assert await alice._call("POST", markers, {"m.fully_read": sent["event_id"], "io.unknown": "x"}) == {}
    bodies, _ = await sync_until(
        alice,
        "r1",
        since,
        lambda b: b[-1]["rooms"]["join"].get(room, {}).get("account_data", {}).get("events"),
    )
    assert bodies[-1]["rooms"]["join"][room]["account_data"]["events"] == [
        {"type": "m.fully_read", "content": {"event_id": sent["event_id"]}}
    ]
    user = quote(alice.user_id or "")
    direct = f"{alice.urls['r1']}{C}/user/{user}/rooms/{quote(room)}/account_data/m.fully_read"
    assert await alice._call("GET", direct) == {"event_id": sent["event_id"]}
    assert await refused(alice._call("PUT", direct, {"event_id": "$x"})) == (405, "M_BAD_JSON")
    for bad in ({"m.fully_read": 5}, {"m.fully_read": "no-sigil"}, {"m.read": ["$x"]}):
        assert await refused(alice._call("POST", markers, bad)) == (400, "M_INVALID_PARAM"), bad
