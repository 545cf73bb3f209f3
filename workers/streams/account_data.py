"""The `account_data` stream: global account data, room account data and room tags.

One stream and one ID generator over three tables (`workers.storage.account_data`). A row names
what changed, not its content: `(user_id, room_id or null, type)`, a tag change as type `m.tag`.
Readers read the content from the database, which is the truth.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, NamedTuple

import asyncpg
from pydantic import Field

from pubsub.streams import Stream
from pubsub.types import IdGenerator
from workers.storage import account_data as store
from workers.streams.handovers import Afters, stored_with_afters

ACCOUNT_DATA = "account_data"
#: The stream's tables: (table, instance column, stream id column), for its ID generator.
TABLES = [
    ("account_data", "instance_name", "stream_id"),
    ("room_account_data", "instance_name", "stream_id"),
    ("room_tags_revisions", "instance_name", "stream_id"),
]
SEQUENCE = "account_data_stream_seq"
_Id = Annotated[str, Field(pattern=r"^[!@A-Za-z0-9_.:=\-/+]{1,255}$")]


class AccountDataRow(NamedTuple):
    """One change: a user's global (`room_id` None) or room account data of `data_type`."""

    user_id: _Id
    room_id: _Id | None
    data_type: Annotated[str, Field(min_length=1, max_length=255)]
    #: Moved keys' old writers and their last rows (`workers.streams.handovers`). (Trailing, optional.)
    after: Afters | None = None


def account_data_stream(
    pool: asyncpg.Pool, generator: IdGenerator, writers: Sequence[str]
) -> Stream[AccountDataRow]:
    async def update(
        instance: str, from_token: int, to_token: int, limit: int
    ) -> list[tuple[int, AccountDataRow]]:
        async with pool.acquire() as conn:
            changes = await store.changes_by_writer(conn, instance, from_token, to_token, limit)
            rows = [(stream_id, AccountDataRow(user, room, kind)) for stream_id, user, room, kind in changes]
            return await stored_with_afters(conn, ACCOUNT_DATA, instance, rows)

    return Stream(ACCOUNT_DATA, AccountDataRow, update, generator, writers, dependency_field="after")
