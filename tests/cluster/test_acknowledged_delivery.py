"""An acknowledged event reaches every reader joined when it was sent.

The black-box check counted events answered 200 that never reached a reader whose join had been
answered 200. One cause needs no fault at all: a user's join and another member's invite of that
same user, sent at once through different sync workers, land in one batch on the room's
persister and are both accepted (the invite after the join), so the user's current membership is
`invite` although its join was acknowledged, and the room's later events are never shown to it.
This test races the two and then sends a message: every user whose join was answered 200 and who
did not leave must get the message.
"""

from __future__ import annotations

import asyncio

import aiohttp
import asyncpg

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster_client import ClusterClient, RequestRefused, timeline_events

ROOMS = 12


async def test_a_message_after_a_join_raced_by_an_invite_reaches_the_joined_user(
    make_cluster: MakeCluster, database_url: str
) -> None:
    cluster = await make_cluster(persisters=2, sync_workers=2, background_workers=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        alice, bob = ClusterClient(session, cluster.urls), ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        await bob.register("bob", via="sync2")
        rooms = [await alice.create_room("invite", via="sync1") for _ in range(ROOMS)]
        for room in rooms:
            await alice.membership(room, "invite", target="bob", via="sync1")
        since = (await bob.sync(via="sync2"))["next_batch"]

        async def race(room: str) -> bool:
            """Bob joins through sync2 while alice invites him again through sync1: whether the
            join was answered 200."""
            joined, invited = await asyncio.gather(
                bob.membership(room, "join", via="sync2"),
                alice.membership(room, "invite", target="bob", via="sync1"),
                return_exceptions=True,
            )
            assert not isinstance(joined, BaseException) or isinstance(joined, RequestRefused), joined
            assert not isinstance(invited, BaseException) or isinstance(invited, RequestRefused), invited
            return not isinstance(joined, BaseException)

        joined = [room for room, ok in zip(rooms, await asyncio.gather(*map(race, rooms)), strict=True) if ok]
        sent = {room: (await alice.send(room, "m.room.message", {"body": "hi"}, via="sync1"))["event_id"]
                for room in joined}  # fmt: skip
        delivered: set[str] = set()
        for _ in range(20):
            body = await bob.sync(via="sync2", since=since, timeout_ms=500)
            since = body["next_batch"]
            delivered |= {e["event_id"] for e in timeline_events(body)}
            if set(sent.values()) <= delivered:
                break
    missed = [room for room, event in sent.items() if event not in delivered]
    assert joined, "no join was answered 200"
    conn = await asyncpg.connect(database_url)
    try:
        memberships = await conn.fetch(
            "SELECT membership, count(*) FROM current_state_events WHERE room_id = ANY($1::text[])"
            " AND type = 'm.room.member' AND state_key = $2 GROUP BY membership",
            missed, bob.user_id,
        )  # fmt: skip
    finally:
        await conn.close()
    assert missed == [], (
        f"{len(missed)} of {len(joined)} messages never reached bob, whose join was answered 200;"
        f" his membership there now: {dict((r[0], r[1]) for r in memberships)}"
    )
