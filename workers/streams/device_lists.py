"""The `device_lists` stream: whose device list changed, and which remote servers to tell.

Two tables, one ID generator: `device_lists_stream` (one row per changed local user) and
`device_lists_outbound_pokes` (one row per remote server that shares a room with the user). A
replication row is one entity: a user id (`@...`: that user's devices changed) or a server name
(pokes for that server are waiting). Never a batch of (user, server) pairs: a reader handles each
row on its own, and a long list of servers never makes one oversized line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, NamedTuple

import asyncpg
from pydantic import Field

from pubsub.streams import Stream
from pubsub.types import IdGenerator
from workers.storage import device_lists as store
from workers.streams.handovers import Afters, stored_with_afters

DEVICE_LISTS = "device_lists"
TABLES = [
    ("device_lists_stream", "instance_name", "stream_id"),
    ("device_lists_outbound_pokes", "instance_name", "stream_id"),
]
SEQUENCE = "device_lists_stream_seq"
Entity = Annotated[str, Field(pattern=r"^[@A-Za-z0-9_.:=\-/+\[\]]{1,255}$")]


class DeviceListRow(NamedTuple):
    """A user id whose device list changed, or a remote server name with pokes waiting."""

    entity: Entity
    #: Moved keys' old writers and their last rows (`workers.streams.handovers`). (Trailing, optional.)
    after: Afters | None = None


def device_lists_stream(
    pool: asyncpg.Pool, generator: IdGenerator, writers: Sequence[str]
) -> Stream[DeviceListRow]:
    async def update(
        instance: str, from_token: int, to_token: int, limit: int
    ) -> list[tuple[int, DeviceListRow]]:
        async with pool.acquire() as conn:
            changes = await store.entities_by_writer(conn, instance, from_token, to_token, limit)
            rows = [(stream_id, DeviceListRow(entity)) for stream_id, entity in changes]
            return await stored_with_afters(conn, DEVICE_LISTS, instance, rows)

    return Stream(DEVICE_LISTS, DeviceListRow, update, generator, writers, dependency_field="after")
