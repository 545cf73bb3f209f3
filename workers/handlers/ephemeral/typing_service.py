"""The typing operations of a worker: set typing (locally on the writer, else forwarded to it),
serve and fetch the stream's rows, and the /sync section.

Roles come from `stream_writers.typing` (one writer). The writer keeps `TypingRooms`, numbers each
change with `MemoryPositions`, keeps it in a `StreamHistory` for readers' catch-ups, applies it to
its own view and hands it to `publish` (which stages the row for RDATA). Every worker, the writer
too, answers /sync from its `TypingView`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pubsub.ticks import until_next_run
from workers.handlers.ephemeral.typing import MAX_TIMEOUT_MS, TypingChange, TypingRooms, TypingView
from workers.handlers.placement.forwarding import Forwarder, OwnerUnavailable, fetch_stream_rows
from workers.streams.memory import MemoryPositions, StreamHistory
from workers.streams.typing import TYPING, TypingRow, typing_row

log = logging.getLogger(__name__)
#: Stage rows for RDATA: [(token, row)], then flush soon.
Publish = Callable[[Sequence[tuple[int, TypingRow]]], None]
#: Rooms whose typing changed (wake their /sync long-polls).
NotifyRooms = Callable[[Iterable[str]], None]


class TypingService:
    def __init__(
        self,
        instance_name: str,
        writer: str | None,
        positions: MemoryPositions,
        forwarder: Forwarder,
        notify: NotifyRooms,
        *,
        max_timeout_ms: int = MAX_TIMEOUT_MS,
        history_rows: int = 10_000,
    ) -> None:
        self.instance_name = instance_name
        self.writer = writer
        self.positions = positions
        self.forwarder = forwarder
        self.notify = notify
        self.publish: Publish | None = None
        self.view = TypingView()
        self.is_writer = writer == instance_name
        self.rooms = TypingRooms(max_timeout_ms)
        self.history: StreamHistory[TypingRow] = StreamHistory(
            positions.get_current_token_for_writer(instance_name), history_rows
        )
        #: Catch-up fetches made as a reader, and how many of them were answered "reset".
        self.fetches = 0
        self.resets = 0
        self._poke = asyncio.Event()

    # -- operations (PUT rooms/{roomId}/typing/{userId}) -------------------------------------------

    async def set_typing(self, room_id: str, user_id: str, typing: bool, timeout_ms: int) -> None:
        """Record that `user_id` types in `room_id` for `timeout_ms` (capped), or stopped.

        Does not check the user's membership: the endpoint must (it has the room's members).
        Raises ValueError for IDs the stream would refuse (400), `OwnerUnavailable` (no writer
        configured, or it is down: 503) or `ForwardRefused` (the writer's 4xx)."""
        if self.writer is None:
            raise OwnerUnavailable("typing writer", "stream_writers.typing is not configured", 30)
        typing_row(room_id, [user_id])  # refuse here what readers would refuse (ValueError)
        if not self.is_writer:
            await self.forwarder.request(
                self.writer,
                "typing",
                "PUT",
                f"/_fanout/internal/typing/{room_id}/{user_id}",
                body={"typing": typing, "timeout": timeout_ms},
                idempotent=True,
            )
            return
        self._changed(self.rooms.set_typing(room_id, user_id, typing, timeout_ms, _now_ms()))
        self._poke.set()

    def typing_section(self, room_ids: Iterable[str], since: int | None = None) -> dict[str, dict[str, Any]]:
        """`{room_id: {"type": "m.typing", "content": {"user_ids": [...]}}}` for /sync (see
        `TypingView.section`); `since` is the typing component of the client's token."""
        return self.view.section(room_ids, since)

    def current_token(self) -> int:
        """Typing's sync-token component. Never compare it to decide whether a token is "before"
        another (Synapse's `is_before_or_eq` skips typing too)."""
        return self.positions.current

    # -- the writer -----------------------------------------------------------------------------

    def _changed(self, changes: list[TypingChange]) -> None:
        if not changes:
            return
        staged: list[tuple[int, TypingRow]] = []
        for room_id, users in changes:
            token = self.positions.get_current_token_for_writer(self.instance_name) + 1
            row = TypingRow(room_id, users)
            staged.append((token, row))
            self.history.append(token, row)
            self.view.apply(token, room_id, users)
            if self.publish is not None:
                self.publish([(token, row)])  # staged before the position moves past it
            self.positions.advance(self.instance_name, token)
        self.notify([room for room, _ in changes])

    async def expire_forever(self) -> None:
        """The writer's timer: end typing at each expiry (run as a task)."""
        while True:
            next_ms = self.rooms.next_expiry_ms()
            if next_ms is None:  # nothing to end: look again on the shared clock's next tick
                wait_s = until_next_run(1.0)
            else:
                wait_s = max(0.0, min(1.0, (next_ms - _now_ms()) / 1000))
            self._poke.clear()
            try:
                await asyncio.wait_for(self._poke.wait(), wait_s)
            except TimeoutError:
                pass
            self._changed(self.rooms.expire(_now_ms()))

    def stream_rows(self, from_token: int, to_token: int, limit: int) -> dict[str, Any]:
        """The answer to a reader's catch-up (see `workers.http.internal`)."""
        rows = self.history.since(from_token, to_token, limit)
        if rows is None:
            return {
                "reset": True,
                "snapshot": [[room, list(users)] for room, users in self.rooms.snapshot().items()],
            }
        return {"reset": False, "rows": [[token, row.room_id, list(row.user_ids)] for token, row in rows]}

    # -- a reader's catch-up --------------------------------------------------------------------

    async def fetch_updates(
        self, instance: str, from_token: int, to_token: int, limit: int
    ) -> list[tuple[int, TypingRow]]:
        """The typing stream's update function on readers: ask the writer.

        A "reset" answer (we are older than its history: it restarted, or we were away long)
        becomes rows at `to_token` that turn our view into its snapshot, rooms we hold that it
        lacks included (their typing ended)."""
        rows, snapshot_rows = await fetch_stream_rows(
            self.forwarder, instance, TYPING, from_token, to_token, limit
        )
        self.fetches += 1
        if snapshot_rows is not None:
            self.resets += 1
            checked = [typing_row(room, users) for room, users in snapshot_rows]
            snapshot = {row.room_id: row.user_ids for row in checked}
            log.info("typing: resync from %s's snapshot (%d rooms) at %d", instance, len(snapshot), to_token)
            changes = self.view.reset_rows(snapshot)
            return [(to_token, TypingRow(room, users)) for room, users in changes][:limit]
        return [(int(t), typing_row(room, users)) for t, room, users in rows]

    def apply(self, token: int, rows: Iterable[TypingRow]) -> list[str]:
        """Replicated rows (reader side), before the position advances; returns the rooms to wake
        once it has (the caller wakes them then: invalidate, advance, wake)."""
        rooms = []
        for row in rows:
            self.view.apply(token, row.room_id, row.user_ids)
            rooms.append(row.room_id)
        return rooms


def _now_ms() -> float:
    return time.time() * 1000
