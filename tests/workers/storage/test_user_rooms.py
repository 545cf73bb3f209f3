"""workers.storage.events.user_rooms: a user's rooms and membership history are one snapshot.

The sync worker caches the pair per user and keeps it from member events' rows; an entry whose
history holds a join its rooms lack stays so (the row finds its position in the history already),
and the room is left out of the user's windows. A join committed while the load reads must be in
both or in neither.
"""

from __future__ import annotations

from typing import Any, cast

import asyncpg

from workers.model import Event, NewEvent
from workers.storage import Conn
from workers.storage import events as store

USER = "@u:hs"


def _join(ordering: int, room: str) -> Event:
    member = NewEvent(f"$join{ordering}", room, "m.room.member", USER, {"membership": "join"}, USER)
    return member.persisted(ordering, "w1", 1000 + ordering)


async def _write(pool: asyncpg.Pool, event: Event) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await store.insert_batch(conn, [event], [event.to_json()], [], "w1")


class CommitsAfterFirstRead:
    """A connection that, after the load's first read returns, lets a writer commit a join."""

    def __init__(self, conn: Conn, pool: asyncpg.Pool, join: Event) -> None:
        self._conn, self._pool, self._join = conn, pool, join
        self.reads = 0

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        records = await self._conn.fetch(query, *args)
        self.reads += 1
        if self.reads == 1:
            await _write(self._pool, self._join)
        return records


async def test_a_join_committed_during_the_load_is_in_both_rooms_and_history_or_neither(
    db_pool: asyncpg.Pool,
) -> None:
    await _write(db_pool, _join(1, "!a:hs"))
    async with db_pool.acquire() as conn:
        racing = CommitsAfterFirstRead(conn, db_pool, _join(2, "!b:hs"))
        loaded = await store.user_rooms(cast(Conn, racing), USER)
        after = await store.user_rooms(conn, USER)
    assert set(loaded.history) <= loaded.rooms, loaded
    assert loaded.rooms == {"!a:hs"} and loaded.history == {"!a:hs": ((1, "join"),)}
    assert after.rooms == {"!a:hs", "!b:hs"}
    assert after.history == {"!a:hs": ((1, "join"),), "!b:hs": ((2, "join"),)}
