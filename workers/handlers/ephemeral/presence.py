"""Presence: the writer's tracker of who syncs where, and every worker's view for /sync.

Pure logic, no I/O: time is passed in (milliseconds); the caller publishes what changed.

* `PresenceTracker` (the presence writer only). Sync bookkeeping is keyed by the sync process's
  *instance id* (random per process start, see `PresenceSyncTracker`), never by its stable name,
  so the entries of a killed run are never confused with those of its successor. A process is
  alive while it sends anything (a USER_SYNC, its periodic re-sends); one silent for
  `process_timeout_ms` is dropped as if it had sent CLEAR_USER_SYNC. A user syncing nowhere goes
  offline `offline_grace_ms` after their last sync ended.
* `PresenceView` (every worker): the latest presence per user with its stream token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from workers.handlers.caches.change_cache import StreamChangeCache

PresenceChange = tuple[str, str, int, str | None, bool]
PRESENCE_EVENT = "m.presence"


@dataclass(slots=True)
class UserPresence:
    presence: str = "offline"
    last_active_ts: int = 0
    status_msg: str | None = None
    currently_active: bool = False
    #: When the user was last seen (a sync ended, a process was cleared, presence was set).
    last_seen_ms: float = 0.0

    def as_row(self, user_id: str) -> PresenceChange:
        return (user_id, self.presence, self.last_active_ts, self.status_msg, self.currently_active)


class PresenceTracker:
    """Per process instance id, the (user, device) pairs syncing there; per user, their presence.

    Every method returns the changes it made, as `(user_id, presence, last_active_ts, status_msg,
    currently_active)` rows (the presence stream's row fields), at most one per user.
    """

    def __init__(self, process_timeout_ms: float, offline_grace_ms: float) -> None:
        self.process_timeout_ms = process_timeout_ms
        self.offline_grace_ms = offline_grace_ms
        self._processes: dict[str, set[tuple[str, str | None]]] = {}
        self._heard: dict[str, float] = {}
        self._syncs: dict[str, int] = {}  # user -> (process, device) pairs syncing
        self._users: dict[str, UserPresence] = {}

    # -- what sync workers say ------------------------------------------------------------------

    def user_sync(
        self,
        instance_id: str,
        user_id: str,
        device_id: str | None,
        start: bool,
        last_sync_ms: float,
        now_ms: float,
    ) -> list[PresenceChange]:
        self._heard[instance_id] = now_ms
        pairs = self._processes.setdefault(instance_id, set())
        pair = (user_id, device_id)
        if start:
            if pair in pairs:
                return []  # a re-send (keep-alive, reconnect): the process is alive, nothing else
            pairs.add(pair)
            self._syncs[user_id] = self._syncs.get(user_id, 0) + 1
            return self._changed(user_id, lambda u: self._started(u, now_ms))
        if pair not in pairs:
            return []
        pairs.discard(pair)
        return self._ended(user_id, last_sync_ms)

    def clear_process(self, instance_id: str, now_ms: float) -> list[PresenceChange]:
        """The process is gone (CLEAR_USER_SYNC, or silent too long): its users stopped syncing now."""
        self._heard.pop(instance_id, None)
        changes: list[PresenceChange] = []
        for user_id, _device in sorted(self._processes.pop(instance_id, set()), key=str):
            changes += self._ended(user_id, now_ms)
        return _last_per_user(changes)

    def heard(self, instance_id: str, now_ms: float) -> None:
        """Any sign of life from a process that reports syncs."""
        if instance_id in self._processes:
            self._heard[instance_id] = now_ms

    # -- what users say -------------------------------------------------------------------------

    def set_presence(
        self, user_id: str, presence: str, status_msg: str | None, now_ms: float
    ) -> list[PresenceChange]:
        def update(user: UserPresence) -> None:
            user.presence = presence
            user.status_msg = status_msg
            user.last_seen_ms = now_ms
            if presence == "online":
                user.last_active_ts = int(now_ms)

        return self._changed(user_id, update)

    def get(self, user_id: str) -> UserPresence:
        return self._users.get(user_id) or UserPresence()

    def syncing(self, user_id: str) -> bool:
        return self._syncs.get(user_id, 0) > 0

    def known_users(self) -> list[str]:
        return sorted(self._users)

    def processes(self) -> dict[str, set[tuple[str, str | None]]]:
        return {iid: set(pairs) for iid, pairs in self._processes.items()}

    # -- time -----------------------------------------------------------------------------------

    def tick(self, now_ms: float) -> list[PresenceChange]:
        """Expire silent processes, then take users syncing nowhere past the grace offline."""
        changes: list[PresenceChange] = []
        for instance_id, heard in sorted(self._heard.items()):
            if now_ms - heard >= self.process_timeout_ms:
                changes += self.clear_process(instance_id, heard)
        for user_id, user in sorted(self._users.items()):
            if (
                user.presence != "offline"
                and not self.syncing(user_id)
                and now_ms - user.last_seen_ms >= self.offline_grace_ms
            ):
                changes += self._changed(user_id, _go_offline)
        return _last_per_user(changes)

    # -- internals ------------------------------------------------------------------------------

    def _started(self, user: UserPresence, now_ms: float) -> None:
        user.currently_active = True
        user.last_active_ts = int(now_ms)
        user.last_seen_ms = now_ms
        if user.presence == "offline":
            user.presence = "online"

    def _ended(self, user_id: str, last_sync_ms: float) -> list[PresenceChange]:
        left = self._syncs.get(user_id, 0) - 1
        if left > 0:
            self._syncs[user_id] = left
            return []
        self._syncs.pop(user_id, None)

        def ended(user: UserPresence) -> None:
            user.currently_active = False
            user.last_seen_ms = max(user.last_seen_ms, last_sync_ms)

        return self._changed(user_id, ended)

    def _changed(self, user_id: str, update: Any) -> list[PresenceChange]:
        user = self._users.setdefault(user_id, UserPresence())
        before = user.as_row(user_id)
        update(user)
        after = user.as_row(user_id)
        return [] if after == before else [after]


def _go_offline(user: UserPresence) -> None:
    user.presence = "offline"
    user.currently_active = False


def _last_per_user(changes: list[PresenceChange]) -> list[PresenceChange]:
    latest = {change[0]: change for change in changes}
    return [latest[user] for user in sorted(latest)]


class PresenceView:
    """Presence as replication delivered it: per user the latest row and its token, and an index of
    who changed after a token (bounded: for a token older than what it holds, it does not know)."""

    __slots__ = ("_users", "changes")

    def __init__(self) -> None:
        self._users: dict[str, tuple[int, PresenceChange]] = {}
        self.changes = StreamChangeCache("presence_changes", floor=0)

    def apply(self, token: int, row: PresenceChange) -> None:
        self._users[row[0]] = (token, row)
        self.changes.changed(row[0], token)

    def changed_after(self, token: int) -> list[str] | None:
        """The users whose presence changed after `token`; None when the index no longer knows."""
        return self.changes.changed_after(token)

    def get(self, user_id: str) -> PresenceChange | None:
        entry = self._users.get(user_id)
        return entry[1] if entry is not None else None

    def token_of(self, user_id: str) -> int:
        """The token of the user's latest change (0: none known)."""
        entry = self._users.get(user_id)
        return entry[0] if entry is not None else 0

    def rows(self) -> list[PresenceChange]:
        return [row for _token, row in (self._users[u] for u in sorted(self._users))]

    def events(self, user_ids: Iterable[str], since: int | None, now_ms: float) -> list[dict[str, Any]]:
        """m.presence events of `user_ids`: all known (since None) or those changed after `since`."""
        out: list[dict[str, Any]] = []
        for user_id in sorted(set(user_ids)):
            entry = self._users.get(user_id)
            if entry is None or (since is not None and entry[0] <= since):
                continue
            out.append(presence_event(entry[1], now_ms))
        return out


def presence_event(row: PresenceChange, now_ms: float) -> dict[str, Any]:
    """The Matrix m.presence event (also the body of GET presence/{userId}/status, as `content`)."""
    user_id, presence, last_active_ts, status_msg, currently_active = row
    content: dict[str, Any] = {"presence": presence, "currently_active": currently_active}
    if last_active_ts:
        content["last_active_ago"] = max(0, int(now_ms) - last_active_ts)
    if status_msg is not None:
        content["status_msg"] = status_msg
    return {"type": PRESENCE_EVENT, "sender": user_id, "content": content}
