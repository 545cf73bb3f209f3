"""The /sync sections of the stored streams: account data, to-device messages, device lists,
receipts (and the device's one-time key counts).

Each is read from the database between the client's `since` and the sync's `now` (per-writer
windows of the stream's token component, `workers.storage.windows`). A `StreamChangeCache` per
stream, fed by every row before the stream's position advances, answers "did anything change for
this user since?" without a query in the common case.

* account data: the user's global account data and the room account data (with `m.tag`) that
  changed in the window; an initial sync gets all of it.
* to-device: the syncing device's messages (`workers.handlers.stored.to_device`); when more wait than one
  sync carries, `now`'s to_device component stops before the first one left.
* receipts: per joined room, the `m.receipt` event of the receipts set in the window (an initial
  sync: every receipt the rooms hold up to `now`), others' private receipts left out; the receipts
  change cache is keyed by room.
* one-time keys: the syncing device's one-time keys left per algorithm and the algorithms of its
  unused fallback keys, with every answer, from the worker's counts cache (invalidated by the
  caches-stream row each upload and claim writes, `workers.handlers.stored.one_time_keys`; a count is not
  news, so it never ends a long-poll by itself).
* device lists (incremental syncs only), from the change cache where it can tell (the database
  otherwise): `changed` holds the users sharing a joined room with the
  syncing user (themself included) whose device list changed in the window, and those who newly
  share one (they joined a room of the user's, or the user joined theirs); `left` holds those who
  no longer share any room after a leave in the window.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from idgen import MultiWriterIdGenerator, SyncToken
from workers.handlers.caches.change_cache import FEW_CHANGED, StreamChangeCache
from workers.handlers.caches.lru import SyncCaches
from workers.handlers.stored.one_time_keys import KeyCounts
from workers.handlers.stored.receipts import receipt_events
from workers.handlers.stored.to_device import ToDeviceInbox
from workers.model import MEMBER_EVENT, Event, UserRooms
from workers.storage import account_data as account_store
from workers.storage import device_lists as device_store
from workers.storage import receipts as receipt_store
from workers.storage.windows import Window
from workers.streams.account_data import ACCOUNT_DATA
from workers.streams.device_lists import DEVICE_LISTS
from workers.streams.receipts import RECEIPTS
from workers.streams.to_device import TO_DEVICE

#: The stored streams' components of a sync token, in text order: a new stream goes last, and a
#: token from before it has no component for it, which reads as the stream's start.
STORED_STREAMS = (ACCOUNT_DATA, DEVICE_LISTS, TO_DEVICE, RECEIPTS)
#: Devices whose clean-up position this worker remembers (the oldest are forgotten first).
MAX_CLEANED = 100_000


@dataclass(slots=True)
class StoredUpdates:
    """What one sync carries of the stored streams."""

    account_data: list[dict[str, Any]] = field(default_factory=list)
    room_account_data: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    to_device: list[dict[str, Any]] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    #: room -> its `m.receipt` event (for the room's `ephemeral.events`).
    receipts: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The syncing device's one-time keys left per algorithm (`device_one_time_keys_count`).
    one_time_key_counts: dict[str, int] = field(default_factory=dict)
    #: Its unused fallback keys' algorithms (`device_unused_fallback_key_types`); None: no device.
    unused_fallback_key_types: list[str] | None = None

    def __bool__(self) -> bool:
        """Whether there is news for the client (the key counts are not: they come with any answer)."""
        return bool(
            self.account_data
            or self.room_account_data
            or self.to_device
            or self.changed
            or self.left
            or self.receipts
        )


class StoredSections:
    def __init__(
        self,
        pool: asyncpg.Pool,
        caches: SyncCaches,
        changes: dict[str, StreamChangeCache],
        generators: dict[str, MultiWriterIdGenerator],
        inbox: ToDeviceInbox,
        key_counts: Callable[[str, str, int], Awaitable[KeyCounts]],
    ) -> None:
        self._pool = pool
        self._key_counts = key_counts
        self._caches = caches
        self._changes = changes
        self._generators = generators
        self._inbox = inbox
        #: (user, device) -> the `since` position up to which this worker deleted the device's
        #: acknowledged messages: while the user's last message is above it, a sync runs the
        #: delivery (which deletes first) even when nothing new arrived.
        self._cleaned: dict[tuple[str, str], int] = {}

    async def collect(
        self,
        user_id: str,
        device_id: str | None,
        user_rooms: UserRooms,
        since: SyncToken | None,
        now: SyncToken,
        events: list[Event],
    ) -> tuple[StoredUpdates, SyncToken]:
        """The sections for (since, now] (since None: an initial sync) and the token they reach."""
        await self.reopen_blind_caches()
        updates = StoredUpdates()
        joined = user_rooms.joined()
        await self._account_data(updates, user_id, joined, since, now)
        await self._receipts(updates, user_id, joined, since, now)
        if device_id is not None:
            now = await self._to_device(updates, user_id, device_id, since, now)
        if since is not None:
            await self._device_lists(updates, user_id, joined, since, now, events)
        return updates, now

    async def add_key_counts(
        self, updates: StoredUpdates, user_id: str, device_id: str, started_ns: int = 0
    ) -> None:
        """The device's one-time key counts and unused fallback key types, when an answer is made
        (not by a long-poll that parks: the counts are no news); as committed after the request
        started at `started_ns` (time.monotonic_ns(); 0: after this call), see `CountReads`."""
        counts = await self._key_counts(user_id, device_id, started_ns)
        updates.one_time_key_counts = counts.one_time
        updates.unused_fallback_key_types = counts.unused_fallback

    def owes_clean_up(self, user_id: str, device_id: str | None, since: SyncToken) -> bool:
        """Whether a sync of the device from `since` would deal with its to-device messages: one
        may be new, or `since` acknowledges some this worker has not deleted yet."""
        if device_id is None:
            return False
        changes = self._changes[TO_DEVICE]
        if changes.may_have_changed(user_id, since.get(TO_DEVICE).stream):
            return True
        last = changes.last(user_id)
        return last is not None and self._cleaned.get((user_id, device_id), -1) < last

    async def reopen_blind_caches(self) -> None:
        """Reopen each change cache whose blind period is over, above the sequence's value now
        (read by the first syncs after the blind period; until then the cache says "maybe")."""
        for stream, changes in self._changes.items():
            if changes.blind_over():
                changes.reopen(await self._generators[stream].get_max_allocated_token())

    async def _account_data(
        self, updates: StoredUpdates, user_id: str, joined: set[str], since: SyncToken | None, now: SyncToken
    ) -> None:
        low = None if since is None else since.get(ACCOUNT_DATA)
        if low is not None and not self._changes[ACCOUNT_DATA].may_have_changed(user_id, low.stream):
            return
        async with self._pool.acquire() as conn:
            found, rooms = await account_store.changed_for_user(
                conn, user_id, Window.between(low, now.get(ACCOUNT_DATA))
            )
        updates.account_data = found
        updates.room_account_data = {r: e for r, e in rooms.items() if r in joined}

    async def _receipts(
        self, updates: StoredUpdates, user_id: str, joined: set[str], since: SyncToken | None, now: SyncToken
    ) -> None:
        low = None if since is None else since.get(RECEIPTS)
        rooms = sorted(joined)
        if low is not None:
            rooms = self._changes[RECEIPTS].any_may_have_changed(rooms, low.stream)
        if not rooms:
            return
        async with self._pool.acquire() as conn:
            found = await receipt_store.room_receipts(conn, rooms, Window.between(low, now.get(RECEIPTS)))
        updates.receipts = receipt_events(found, user_id)

    async def _to_device(
        self, updates: StoredUpdates, user_id: str, device_id: str, since: SyncToken | None, now: SyncToken
    ) -> SyncToken:
        low = None if since is None else since.get(TO_DEVICE)
        key = (user_id, device_id)
        changes = self._changes[TO_DEVICE]
        if low is not None and not changes.may_have_changed(user_id, low.stream):
            last = changes.last(user_id)
            if last is None or self._cleaned.get(key, -1) >= last:
                return now  # nothing new, nothing acknowledged left to delete
        delivery = await self._inbox.deliver(user_id, device_id, low, now.get(TO_DEVICE))
        if low is not None:
            self._cleaned.pop(key, None)
            if len(self._cleaned) >= MAX_CLEANED:
                self._cleaned.pop(next(iter(self._cleaned)))
            self._cleaned[key] = low.stream
        updates.to_device = delivery.events
        return SyncToken({**{s: now.get(s) for s in now.streams()}, TO_DEVICE: delivery.token})

    async def _device_lists(
        self,
        updates: StoredUpdates,
        user_id: str,
        joined: set[str],
        since: SyncToken,
        now: SyncToken,
        events: list[Event],
    ) -> None:
        newly: set[str] = set()
        gone: set[str] = set()
        for event in events:
            if event.type != MEMBER_EVENT or event.state_key is None:
                continue
            if event.state_key == user_id and event.membership == "join":
                newly |= await self._caches.joined_members.get(event.room_id)
            elif event.membership == "join" and event.room_id in joined:
                newly.add(event.state_key)
            elif event.membership in ("leave", "ban"):
                members = (
                    await self._caches.joined_members.get(event.room_id)
                    if event.state_key == user_id
                    else {event.state_key}
                )
                gone |= members
        newly.discard(user_id)  # one's own list is "changed" only when it changed
        low = since.get(DEVICE_LISTS)
        cache = self._changes[DEVICE_LISTS]
        recent = cache.changed_after(low.stream)
        if recent is not None and len(recent) <= FEW_CHANGED and not newly and not gone:
            sharing = await self._caches.sharing_a_room(user_id, recent)
            candidates = sorted(sharing)
        else:
            sharing = await self._caches.sharing_a_room(user_id)
            candidates = cache.any_may_have_changed(sorted(sharing), low.stream)
        high = now.get(DEVICE_LISTS)
        changed, unsure = cache.changed_within(candidates, low, high)
        if unsure:
            async with self._pool.acquire() as conn:
                changed |= await device_store.changed_users(conn, unsure, Window.between(low, high))
        updates.changed = sorted((changed | newly) & sharing)
        updates.left = sorted(gone - sharing)
