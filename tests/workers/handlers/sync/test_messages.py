"""workers.handlers.sync.messages: a sync token as a /messages bound stands for the room's last
event it covers, for every writer the token names, retired or not."""

from __future__ import annotations

from typing import Any, cast

import asyncpg

from idgen import MultiWriterStreamToken, SyncToken
from workers.handlers.sync.messages import Messages
from workers.model import NewEvent
from workers.storage.events import insert_batch

ROOM = "!moved:t"


async def test_a_tokens_position_in_a_room_counts_a_retired_writers_events(db_pool: asyncpg.Pool) -> None:
    """The room moved from p1 to p3 after its event at 10; p3 wrote 12 and 14 and was then
    retired: no worker lists it any more. A token at `m11~p3.14` covers both. The old reading
    looked only at the current writers, took p3 at 11 and answered 10, so a client filling a
    joined room's gap back to its `since` got p3's 12 and 14 again, outside every window of its
    history."""
    placed = [(10, "p1"), (12, "p3"), (14, "p3")]
    async with db_pool.acquire() as conn:
        for ordering, writer in placed:
            event = NewEvent(f"$e{ordering}", ROOM, "m.room.message", "@u:t", {"body": "x"})
            stored = event.persisted(ordering, writer, 0)
            await insert_batch(conn, [stored], [stored.to_json()], [], writer)
    token = SyncToken({"events": MultiWriterStreamToken(11, {"p3": 14})})

    async def decode(_text: str) -> SyncToken:
        return token

    def current() -> SyncToken:
        return SyncToken({"events": MultiWriterStreamToken(14)})

    unused = cast("Any", None)  # caches and room versions: a position reads neither
    messages = Messages(db_pool, unused, decode, current, unused)
    assert await messages.position(ROOM, "m11~3.14") == 14
    assert await messages.position(ROOM, "t12") == 12
    token = SyncToken({"events": MultiWriterStreamToken(12, {"p1": 13})})  # p3 at 12
    assert await messages.position(ROOM, "m12~1.13") == 12
    token = SyncToken({"events": MultiWriterStreamToken(11, {"p1": 13})})  # p3's 12 not covered
    assert await messages.position(ROOM, "m11~1.13") == 10
