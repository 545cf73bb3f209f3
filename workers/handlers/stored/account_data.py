"""Account data: a user's global and per-room JSON objects by type, and room tags.

Writes run on the user's account_data writer (`workers.handlers.placement.stream_writes`); reads come from
the database, whichever worker serves them. The checks of the client API (who may write whose
data, which types the server controls) happen before a write is forwarded; the writer checks the
shape of what it is handed again, since the request came over the network.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from workers.handlers.placement.stream_writes import (
    UserStreamWrites,
    object_arg,
    text_arg,
    written,
)
from workers.storage import account_data as store
from workers.streams.account_data import AccountDataRow

#: Types the server manages itself; a client cannot set them through these endpoints (405).
SERVER_MANAGED = frozenset({"m.fully_read", "m.push_rules"})


class AccountData:
    def __init__(self, writes: UserStreamWrites, pool: asyncpg.Pool) -> None:
        self.writes = writes
        self._pool = pool
        writes.ops.update(put=self._put, tag=self._tag)

    async def put(self, user_id: str, room_id: str | None, kind: str, content: dict[str, Any]) -> None:
        """Set `user_id`'s global (room None) or room account data of type `kind`."""
        await self.writes.run(
            user_id, "put", {"user_id": user_id, "room_id": room_id, "type": kind, "content": content}
        )

    async def set_tag(self, user_id: str, room_id: str, tag: str, content: dict[str, Any] | None) -> None:
        """Add or replace a room tag (`content` None: remove it)."""
        await self.writes.run(
            user_id, "tag", {"user_id": user_id, "room_id": room_id, "tag": tag, "content": content}
        )

    async def get(self, user_id: str, room_id: str | None, kind: str) -> dict[str, Any] | None:
        async with self._pool.acquire() as conn:
            if room_id is None:
                return await store.get_global(conn, user_id, kind)
            return await store.get_room(conn, user_id, room_id, kind)

    async def tags(self, user_id: str, room_id: str) -> dict[str, dict[str, Any]]:
        async with self._pool.acquire() as conn:
            return await store.get_tags(conn, user_id, room_id)

    # -- on the writer ---------------------------------------------------------------------------

    async def _put(self, args: dict[str, Any]) -> dict[str, Any]:
        user_id, kind = text_arg(args, "user_id"), text_arg(args, "type")
        room_id, content = text_arg(args, "room_id", optional=True), object_arg(args, "content")
        me = self.writes.name

        async def body(conn: Any, ids: list[int]) -> list[tuple[int, Any]]:
            if room_id is None:
                changed = await store.put_global(conn, user_id, kind, content, ids[0], me)
            else:
                changed = await store.put_room(conn, user_id, room_id, kind, content, ids[0], me)
            return [(ids[0], AccountDataRow(user_id, room_id, kind))] if changed else []

        return written(await self.writes.here().write(1, body, [user_id], user_id))

    async def _tag(self, args: dict[str, Any]) -> dict[str, Any]:
        user_id, room_id, tag = text_arg(args, "user_id"), text_arg(args, "room_id"), text_arg(args, "tag")
        content = object_arg(args, "content", optional=True)
        me = self.writes.name

        async def body(conn: Any, ids: list[int]) -> list[tuple[int, Any]]:
            await store.set_tag(conn, user_id, room_id, tag, content, ids[0], me)
            return [(ids[0], AccountDataRow(user_id, room_id, store.TAG_TYPE))]

        return written(await self.writes.here().write(1, body, [user_id], user_id))
