"""The `to_device` stream: messages sent straight to devices (`device_inbox`).

A row is one recipient entity of a send: a local user id (`@...`: messages for some of that
user's devices wait in `device_inbox`) or a remote server name (messages wait in
`device_federation_outbox`). The messages themselves stay in the database; a reader wakes the
user's /sync, which reads them there. No table row is shared between writes (no "max id" row): a
writer only inserts, and the stream's position lives in `stream_positions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import asyncpg

from pubsub.streams import Stream
from pubsub.types import IdGenerator
from workers.storage import to_device as store
from workers.streams.device_lists import Entity
from workers.streams.handovers import Afters, stored_with_afters

TO_DEVICE = "to_device"
TABLES = [
    ("device_inbox", "instance_name", "stream_id"),
    ("device_federation_outbox", "instance_name", "stream_id"),
]
SEQUENCE = "device_inbox_stream_seq"


class ToDeviceRow(NamedTuple):
    """A local user id with new messages, or a remote server name with messages to send."""

    entity: Entity
    #: Moved keys' old writers and their last rows (`workers.streams.handovers`). (Trailing, optional.)
    after: Afters | None = None


def to_device_stream(
    pool: asyncpg.Pool, generator: IdGenerator, writers: Sequence[str]
) -> Stream[ToDeviceRow]:
    async def update(
        instance: str, from_token: int, to_token: int, limit: int
    ) -> list[tuple[int, ToDeviceRow]]:
        async with pool.acquire() as conn:
            changes = await store.entities_by_writer(conn, instance, from_token, to_token, limit)
            rows = [(stream_id, ToDeviceRow(entity)) for stream_id, entity in changes]
            return await stored_with_afters(conn, TO_DEVICE, instance, rows)

    return Stream(TO_DEVICE, ToDeviceRow, update, generator, writers, dependency_field="after")
