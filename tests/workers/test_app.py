"""Replicated rows invalidate caches BEFORE waiting readers are woken (the rule stale reads break)."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import timeline_events


async def test_caches_are_invalidated_before_waiters_wake(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    persister = await make_worker("p1", ["p1"])
    reader = await make_worker("s1", ["p1"])
    alice = client_for(http, [persister, reader], ["p1"])
    bob = client_for(http, [persister, reader], ["p1"])
    await alice.register("@alice")
    await bob.register("@bob")
    room = await alice.create_room("public", via="s1")
    since = (await bob.sync("s1"))["next_batch"]
    await bob.sync("s1", since, 0)  # warms s1's cache of bob's rooms: it does not hold `room`
    assert "@bob:localhost" in reader.caches.rooms_for_user

    woken_for_bob: list[bool] = []

    def at_wake(rooms: frozenset[str], users: frozenset[str]) -> None:
        # The moment readers are woken: bob's cached room list must be gone or already fresh.
        if "@bob:localhost" in users:
            cache = reader.caches.rooms_for_user
            woken_for_bob.append(
                "@bob:localhost" not in cache or room in cache._entries["@bob:localhost"].rooms
            )

    reader.notifier.add_listener(at_wake)
    poll = asyncio.create_task(bob.sync("s1", since, 10_000))
    await asyncio.sleep(0.2)  # bob is now waiting on s1
    await bob.membership(room, "join")
    result = await asyncio.wait_for(poll, 15)
    assert woken_for_bob and all(woken_for_bob), woken_for_bob
    assert [e["content"].get("membership") for e in timeline_events(result)] == ["join"]
