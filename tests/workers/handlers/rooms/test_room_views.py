"""The room's writer keeps the memberships its rules read: a member event it commits is stored as
the current membership (the next check reads no database), and what it stores is what the
database holds."""

from __future__ import annotations

import aiohttp
import asyncpg

from tests.workers.conftest import MakeWorker, client_for


async def test_a_committed_membership_is_stored_not_read_again(
    make_worker: MakeWorker, http: aiohttp.ClientSession, database_url: str
) -> None:
    writer = await make_worker("p1", ["p1"])
    alice, bob = (client_for(http, [writer], ["p1"]) for _ in range(2))
    await alice.register("@views-alice")
    await bob.register("@views-bob")
    assert bob.user_id is not None
    room = await alice.create_room("public")
    memberships = writer.room_views.memberships
    for change in ("join", "leave", "join"):
        await bob.membership(room, change)
        assert (room, bob.user_id) in memberships
        if change == "join":
            misses = memberships.misses
            await bob.send(room, "m.room.message", {"body": "in"})
            assert memberships.misses == misses  # the send's check found bob's membership stored
    await alice.membership(room, "ban", target=bob.user_id)
    conn = await asyncpg.connect(database_url)
    try:
        stored = await conn.fetchval(
            "SELECT membership FROM current_state_events WHERE room_id = $1 AND type = 'm.room.member'"
            " AND state_key = $2",
            room,
            bob.user_id,
        )
    finally:
        await conn.close()
    assert stored == "ban" and await memberships.get((room, bob.user_id)) == "ban"
