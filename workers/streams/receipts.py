"""The `receipts` stream: read receipts, with the row grammar of Synapse's receipts stream.

A row is `[room_id, receipt_type, user_id, event_id, thread_id, data]`: the whole receipt (it is
small), so a reader could serve it without a query; readers still read /sync's receipts from the
database, which is the truth. A room's receipts are written by one writer (`writer_for_room`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, NamedTuple

import asyncpg
from pydantic import Field

from pubsub.streams import Stream
from pubsub.types import IdGenerator
from workers.storage import receipts as store
from workers.streams.handovers import Afters, stored_with_afters

RECEIPTS = "receipts"
TABLES = [("receipts", "instance_name", "stream_id")]
SEQUENCE = "receipts_stream_seq"
_Id = Annotated[str, Field(pattern=r"^[!$@A-Za-z0-9_.:=\-/+]{1,255}$")]
_Text = Annotated[str, Field(min_length=1, max_length=255)]


class ReceiptRow(NamedTuple):
    room_id: _Id
    receipt_type: _Text
    user_id: _Id
    event_id: _Id
    thread_id: _Text | None
    #: What the receipt says beside its event: `{"ts": ms}` for the receipts of this server.
    data: Annotated[dict[str, Any], Field(max_length=16)]
    #: Moved keys' old writers and their last rows (`workers.streams.handovers`). (Trailing, optional.)
    after: Afters | None = None

    @classmethod
    def of(cls, receipt: store.StoredReceipt) -> ReceiptRow:
        return cls(
            receipt.room_id, receipt.receipt_type, receipt.user_id, receipt.event_id, receipt.thread_id,
            receipt.data,
        )  # fmt: skip


def receipts_stream(pool: asyncpg.Pool, generator: IdGenerator, writers: Sequence[str]) -> Stream[ReceiptRow]:
    async def update(
        instance: str, from_token: int, to_token: int, limit: int
    ) -> list[tuple[int, ReceiptRow]]:
        async with pool.acquire() as conn:
            changes = await store.receipts_by_writer(conn, instance, from_token, to_token, limit)
            rows = [(stream_id, ReceiptRow.of(receipt)) for stream_id, receipt in changes]
            return await stored_with_afters(conn, RECEIPTS, instance, rows)

    return Stream(RECEIPTS, ReceiptRow, update, generator, writers, dependency_field="after")
