"""The presence operations of a worker: set/get presence (forwarded to the presence writer), the
writer's handling of USER_SYNC / CLEAR_USER_SYNC and its expiry timer, the stream's rows, and
the /sync section.

Roles come from `stream_writers.presence` (one writer), which holds a `PresenceTracker`. Every
worker keeps a `PresenceView` of the replicated rows for /sync.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from pubsub.ticks import sleep_to_next_run
from pubsub.wire import ClearUserSync, UserSync
from workers.handlers.caches.change_cache import FEW_CHANGED
from workers.handlers.ephemeral.presence import PresenceChange, PresenceTracker, PresenceView, presence_event
from workers.handlers.placement.forwarding import Forwarder, OwnerUnavailable, fetch_stream_rows
from workers.streams.memory import MemoryPositions, StreamHistory
from workers.streams.presence import PRESENCE, PresenceRow, presence_row

log = logging.getLogger(__name__)
Publish = Callable[[Sequence[tuple[int, PresenceRow]]], None]
NotifyUsers = Callable[[Iterable[str]], None]
#: user -> every user sharing a room with them (themselves included).
#: (user, among or None) -> the users of `among` (or all) sharing a joined room with the user.
Sharing = Callable[[str, Iterable[str] | None], Awaitable[set[str]]]


class PresenceService:
    def __init__(
        self,
        instance_name: str,
        writer: str | None,
        positions: MemoryPositions,
        forwarder: Forwarder,
        notify: NotifyUsers,
        *,
        process_timeout_s: float = 300.0,
        offline_grace_s: float = 30.0,
        history_rows: int = 10_000,
    ) -> None:
        self.instance_name = instance_name
        self.writer = writer
        self.positions = positions
        self.forwarder = forwarder
        self.notify = notify
        self.publish: Publish | None = None
        self.is_writer = writer == instance_name
        self.tracker = PresenceTracker(process_timeout_s * 1000, offline_grace_s * 1000)
        self.view = PresenceView()
        self.history: StreamHistory[PresenceRow] = StreamHistory(
            positions.get_current_token_for_writer(instance_name), history_rows
        )
        self.fetches = 0
        self.resets = 0

    # -- operations (PUT/GET presence/{userId}/status) --------------------------------------------

    async def set_presence(self, user_id: str, presence: str, status_msg: str | None) -> None:
        """Set a user's presence ("online", "unavailable", "offline") and status message.
        Raises ValueError for values the stream would refuse (400), `OwnerUnavailable` (503) or
        `ForwardRefused` (the writer's 4xx; see `workers.handlers.placement.forwarding`)."""
        writer = self._writer()
        presence_row((user_id, presence, 0, status_msg, False))  # refuse what readers would (ValueError)
        if not self.is_writer:
            await self.forwarder.request(
                writer,
                "presence_set",
                "PUT",
                f"/_fanout/internal/presence/{user_id}",
                body={"presence": presence, "status_msg": status_msg},
                idempotent=True,
            )
            return
        self._changed(self.tracker.set_presence(user_id, presence, status_msg, _now_ms()))

    async def get_presence(self, user_id: str) -> dict[str, Any]:
        """The `content` of the user's m.presence event, from the writer (read-your-writes)."""
        writer = self._writer()
        if not self.is_writer:
            return await self.forwarder.request(
                writer, "presence_get", "GET", f"/_fanout/internal/presence/{user_id}", idempotent=True
            )
        content: dict[str, Any] = presence_event(self.tracker.get(user_id).as_row(user_id), _now_ms())[
            "content"
        ]
        return content

    async def presence_section(
        self, user_id: str, since: int | None, upto: int | None, sharing: Sharing
    ) -> list[dict[str, Any]]:
        """For /sync's `presence.events`: m.presence events of the users sharing a room with
        `user_id` whose presence changed in (since, upto] (all known ones when `since` is None)."""
        changed = None if since is None else self.view.changed_after(since)
        few = changed is not None and len(changed) <= FEW_CHANGED
        users = await sharing(user_id, changed if few else None)
        events = self.view.events(users, since, _now_ms())
        if upto is None:
            return events
        return [e for e in events if self.view.token_of(e["sender"]) <= upto]

    def current_token(self) -> int:
        """Presence's sync-token component."""
        return self.positions.current

    def _writer(self) -> str:
        if self.writer is None:
            raise OwnerUnavailable("presence writer", "stream_writers.presence is not configured", 30)
        return self.writer

    # -- the writer -----------------------------------------------------------------------------

    def on_user_sync(self, command: UserSync | ClearUserSync) -> None:
        """A USER_SYNC / CLEAR_USER_SYNC from any process (only the writer acts on it)."""
        if not self.is_writer:
            return
        now = _now_ms()
        if isinstance(command, ClearUserSync):
            log.info("presence: process cleared instance_id=%s", command.instance_id)
            self._changed(self.tracker.clear_process(command.instance_id, now))
            return
        self._changed(
            self.tracker.user_sync(
                command.instance_id,
                command.user_id,
                command.device_id,
                command.state == "start",
                command.last_sync_ms,
                now,
            )
        )

    async def tick_forever(self, interval_s: float = 1.0) -> None:
        """The writer's timer: expire silent processes, take idle users offline (run as a task)."""
        while True:
            await sleep_to_next_run(interval_s)
            self._changed(self.tracker.tick(_now_ms()))

    def _changed(self, changes: list[PresenceChange]) -> None:
        if not changes:
            return
        for change in changes:
            token = self.positions.get_current_token_for_writer(self.instance_name) + 1
            row = presence_row(change)
            self.history.append(token, row)
            self.view.apply(token, change)
            if self.publish is not None:
                self.publish([(token, row)])
            self.positions.advance(self.instance_name, token)
        self.notify([change[0] for change in changes])

    def stream_rows(self, from_token: int, to_token: int, limit: int) -> dict[str, Any]:
        rows = self.history.since(from_token, to_token, limit)
        if rows is None:
            snapshot = [list(self.tracker.get(u).as_row(u)) for u in self.tracker.known_users()]
            return {"reset": True, "snapshot": snapshot}
        return {"reset": False, "rows": [[token, *row] for token, row in rows]}

    # -- a reader's catch-up --------------------------------------------------------------------

    async def fetch_updates(
        self, instance: str, from_token: int, to_token: int, limit: int
    ) -> list[tuple[int, PresenceRow]]:
        fetched, snapshot = await fetch_stream_rows(
            self.forwarder, instance, PRESENCE, from_token, to_token, limit
        )
        self.fetches += 1
        if snapshot is not None:
            self.resets += 1
            rows = [presence_row(values) for values in snapshot]
            known = {row.user_id for row in rows}
            # Users we hold that the writer no longer knows (it restarted): offline.
            rows += [
                PresenceRow(row[0], "offline", row[2], None, False)
                for row in self.view.rows()
                if row[0] not in known and row[1] != "offline"
            ]
            return [(to_token, row) for row in rows][:limit]
        return [(int(values[0]), presence_row(values[1:])) for values in fetched]

    def apply(self, token: int, rows: Iterable[PresenceRow]) -> list[str]:
        users = []
        for row in rows:
            self.view.apply(token, tuple(row))  # type: ignore[arg-type]
            users.append(row.user_id)
        return users


def _now_ms() -> float:
    return time.time() * 1000
