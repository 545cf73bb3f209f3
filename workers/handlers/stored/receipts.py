"""Read receipts: written on the room's receipts writer, read by /sync on any worker.

`POST /rooms/{roomId}/receipt/{type}/{eventId}` (and `read_markers`' `m.read`/`m.read.private`)
runs `Receipts.put` on any worker; the room's writer (`RoomStreamWrites`: one writer per room)
checks that the user is joined and the event is in the room, and stores the receipt unless the
user's receipt of that type and thread already is for the same or a later event (then nothing is
written and no stream ID is taken). One write, one stream row, one id.

/sync (`m.receipt` in a joined room's `ephemeral.events`) reads the receipts of the rooms the
receipts change cache names between the token's receipts component and now; a private receipt
(`m.read.private`) reaches only its owner, and wakes only them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import asyncpg

from workers.handlers.placement.stream_writes import RoomStreamWrites, text_arg, written
from workers.handlers.rooms.rules import load_membership
from workers.storage import Conn
from workers.storage import receipts as store
from workers.storage.receipts import StoredReceipt
from workers.streams.receipts import ReceiptRow

READ = "m.read"
READ_PRIVATE = "m.read.private"
#: The receipt types a client may send (`m.fully_read` is a read marker: room account data).
RECEIPT_TYPES = (READ, READ_PRIVATE)


class ReceiptRefused(Exception):
    """The room's writer refused a receipt: not joined (403), or no such event in the room (404)."""

    def __init__(self, status: int, errcode: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.errcode = errcode


def receipt_events(receipts: Iterable[StoredReceipt], viewer: str) -> dict[str, dict[str, Any]]:
    """room -> the `m.receipt` event `viewer` sees of `receipts` (others' private receipts left out)."""
    out: dict[str, dict[str, Any]] = {}
    for r in receipts:
        if r.receipt_type == READ_PRIVATE and r.user_id != viewer:
            continue
        content = out.setdefault(r.room_id, {"type": "m.receipt", "content": {}})["content"]
        data = {**r.data, **({"thread_id": r.thread_id} if r.thread_id is not None else {})}
        content.setdefault(r.event_id, {}).setdefault(r.receipt_type, {})[r.user_id] = data
    return out


def woken_by(row: tuple[Any, ...]) -> tuple[set[str], set[str]]:
    """(rooms, users) a receipts row wakes: the room, or only the owner of a private receipt. A
    row of one field (a room id: a write whose outcome is unknown) wakes the room."""
    if len(row) > 2 and row[1] == READ_PRIVATE:
        return set(), {row[2]}
    return {row[0]}, set()


class Receipts:
    def __init__(self, writes: RoomStreamWrites, pool: asyncpg.Pool) -> None:
        self.writes = writes
        self._pool = pool
        writes.ops["put"] = self._put

    async def put(
        self, room_id: str, receipt_type: str, user_id: str, event_id: str, thread_id: str | None
    ) -> None:
        """Store the user's receipt on the room's writer. Raises ReceiptRefused, OwnerUnavailable,
        ForwardRefused."""
        answer = await self.writes.run(
            room_id,
            "put",
            {
                "room_id": room_id, "receipt_type": receipt_type, "user_id": user_id,
                "event_id": event_id, "thread_id": thread_id,
            },
        )  # fmt: skip
        error = answer.get("error")
        if isinstance(error, str):
            status, errcode = answer.get("status"), answer.get("errcode")
            raise ReceiptRefused(
                status if isinstance(status, int) else 400,
                errcode if isinstance(errcode, str) else "M_UNKNOWN",
                error,
            )

    # -- on the writer ---------------------------------------------------------------------------

    async def _put(self, args: dict[str, Any]) -> dict[str, Any]:
        receipt = StoredReceipt(
            text_arg(args, "room_id"), text_arg(args, "receipt_type"), text_arg(args, "user_id"),
            text_arg(args, "event_id"), text_arg(args, "thread_id", optional=True),
            {"ts": int(time.time() * 1000)},
        )  # fmt: skip
        if receipt.receipt_type not in RECEIPT_TYPES:
            raise ValueError(f"receipt_type must be one of {RECEIPT_TYPES}")
        async with self._pool.acquire() as conn:
            refusal, ordering = await self._check(conn, receipt)
        if refusal is not None:
            return refusal
        if ordering is None:
            return {}  # the user's receipt is for this event or a later one already
        me = self.writes.name

        async def body(conn: Conn, ids: list[int]) -> list[tuple[int, Any]]:
            if not await store.put_receipt(conn, receipt, ordering, ids[0], me):
                return []  # a later receipt of the key committed meanwhile
            return [(ids[0], ReceiptRow.of(receipt))]

        return written(await self.writes.here().write(1, body, [receipt.room_id], receipt.room_id))

    @staticmethod
    async def _check(conn: Conn, receipt: StoredReceipt) -> tuple[dict[str, Any] | None, int | None]:
        """(a refusal answer, or None; the event's stream ordering when the receipt moves forward)."""
        if await load_membership(conn, receipt.room_id, receipt.user_id) != "join":
            return _refusal(403, "M_FORBIDDEN", f"{receipt.user_id} is not in {receipt.room_id}"), None
        position = await store.event_position(conn, receipt.event_id)
        if position is None or position[0] != receipt.room_id:
            return _refusal(404, "M_NOT_FOUND", f"no event {receipt.event_id} in {receipt.room_id}"), None
        forward = await store.later_than_held(
            conn, receipt.room_id, receipt.receipt_type, receipt.user_id, receipt.thread_id, position[1]
        )
        return None, position[1] if forward else None


def _refusal(status: int, errcode: str, message: str) -> dict[str, Any]:
    return {"status": status, "errcode": errcode, "error": message}
