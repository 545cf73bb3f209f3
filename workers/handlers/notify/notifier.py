"""Wakes long-polling readers when something they may see has arrived.

The replication path calls `notify` only after it has invalidated caches and advanced the ID
generator, so a woken reader always reads fresh caches and a current token. A waiter is
registered BEFORE the reader computes its response, so a notification that lands while it is
computing is not lost: the waiter is already set when it starts waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterable

#: Long-poll timeouts end on this grid (seconds of the event loop's clock).
TIMEOUT_GRID_S = 0.1
#: Timeouts shorter than this end exactly when asked.
GRID_FROM_S = 1.0


def poll_deadline(now: float, timeout_s: float) -> float:
    """When a long-poll of `timeout_s` that starts at `now` (the event loop's `time()`) ends.

    A timeout of `GRID_FROM_S` or more ends at the last `TIMEOUT_GRID_S` boundary before it: at
    most 0.1 s early, never late (the spec's `timeout` is the longest a poll may wait). Polls
    whose timeouts fall in one tick then time out in one event-loop turn: their answers' key-count
    reads share one statement (`CountReads`) and the loop wakes once for them, not once each.
    With 10,000 idle polls re-polling every 30 s, this cut a re-poll's CPU from 0.52-0.59 to
    0.20-0.22 ms (`fanout bench crowd`, docs/performance.md). A shorter timeout ends exactly: a client asking
    for half a second must not be answered at once."""
    exact = now + timeout_s
    if timeout_s < GRID_FROM_S:
        return exact
    return math.floor(exact / TIMEOUT_GRID_S) * TIMEOUT_GRID_S


class Waiter:
    """One long-poll's registration. A bare future and one timer while it waits, nothing before:
    a sync worker holds ten thousand of them (an Event and `wait_for` cost a task and a second
    future each)."""

    __slots__ = ("_future", "_notifier", "device_id", "rooms", "user_id", "woken", "woken_at")

    def __init__(
        self,
        user_id: str,
        rooms: frozenset[str],
        notifier: Notifier | None = None,
        device_id: str | None = None,
    ) -> None:
        self.user_id = user_id
        self.device_id = device_id
        self.rooms = rooms
        self.woken = False
        #: time.monotonic() of the notify that woke it (for the wake-latency histogram).
        self.woken_at = 0.0
        self._future: asyncio.Future[bool] | None = None
        self._notifier = notifier

    def __enter__(self) -> Waiter:
        """Registered with its notifier (a plain context manager: no generator per long-poll)."""
        if self._notifier is not None:
            self._notifier.register(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._notifier is not None:
            self._notifier.unregister(self)

    def wake(self, at: float) -> None:
        self.woken, self.woken_at = True, at
        future = self._future
        if future is not None and not future.done():
            future.set_result(True)

    async def wait(self, until: float) -> bool:
        """True if woken (before the call, or by `until`, in the event loop's time); False at
        `until` (see `poll_deadline`)."""
        if self.woken:
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._future = future
        timer = loop.call_at(until, _time_out, future)
        try:
            return await future
        finally:
            timer.cancel()
            self._future = None


def _time_out(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)


class Notifier:
    """Waiters indexed by room and by user; `notify` wakes exactly those concerned."""

    def __init__(self) -> None:
        self._by_room: dict[str, set[Waiter]] = {}
        self._by_user: dict[str, set[Waiter]] = {}
        self._listeners: list[Callable[[frozenset[str], frozenset[str]], None]] = []
        self._position_moved = asyncio.Event()
        self.notifications = 0
        self.wakeups = 0
        #: Bumped on every notify and position move; lets a reader see it missed one.
        self.generation = 0

    def waiter(self, user_id: str, rooms: frozenset[str], device_id: str | None = None) -> Waiter:
        """A waiter for `user_id` (its `device_id`) and `rooms`, registered while its `with` block
        runs."""
        return Waiter(user_id, rooms, self, device_id)

    def register(self, waiter: Waiter) -> None:
        self._by_user.setdefault(waiter.user_id, set()).add(waiter)
        for room in waiter.rooms:
            self._by_room.setdefault(room, set()).add(waiter)

    def unregister(self, waiter: Waiter) -> None:
        self._discard(self._by_user, waiter.user_id, waiter)
        for room in waiter.rooms:
            self._discard(self._by_room, room, waiter)

    @staticmethod
    def _discard(index: dict[str, set[Waiter]], key: str, waiter: Waiter) -> None:
        waiters = index.get(key)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del index[key]

    def watching(self, room_id: str) -> bool:
        """Whether a long-poll waits on `room_id` now."""
        return room_id in self._by_room

    def devices_on(self, rooms: Iterable[str]) -> set[tuple[str, str]]:
        """The (user, device) of the long-polls waiting on any of `rooms` that name a device."""
        by_room = self._by_room
        return {
            (w.user_id, w.device_id)
            for room in rooms
            for w in by_room.get(room, ())
            if w.device_id is not None and not w.woken
        }

    def add_listener(self, listener: Callable[[frozenset[str], frozenset[str]], None]) -> None:
        """Called synchronously on every notify with (rooms, users), before waiters run."""
        self._listeners.append(listener)

    def notify(self, rooms: Iterable[str], users: Iterable[str]) -> int:
        """Wake the waiters of `rooms` and of `users`; returns how many were woken."""
        room_set, user_set = frozenset(rooms), frozenset(users)
        self.notifications += 1
        self.generation += 1
        for listener in self._listeners:
            listener(room_set, user_set)
        woken: set[Waiter] = set()
        for room in room_set:
            woken |= self._by_room.get(room, set())
        for user in user_set:
            woken |= self._by_user.get(user, set())
        now = time.monotonic()
        for waiter in woken:
            waiter.wake(now)
        self.wakeups += len(woken)
        return len(woken)

    def position_moved(self) -> None:
        """A stream position advanced (with or without rows): wake `wait_for_position` callers."""
        self.generation += 1
        self._position_moved.set()
        self._position_moved = asyncio.Event()

    async def wait_for_position(self, within_s: float) -> None:
        """Return when a position next moves, or after `within_s` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._position_moved.wait(), within_s)

    def notify_all(self) -> None:
        """Wake everyone (shutdown)."""
        self.generation += 1
        now = time.monotonic()
        for waiters in self._by_user.values():
            for waiter in waiters:
                waiter.wake(now)

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._by_user.values())


class DeferredWakes:
    """A writer's wake-ups for its own writes, held until its position covers them.

    Writes may finish out of order: the writer's position stops below one still in flight, so a
    reader woken for a later write would find nothing new and sleep again, and nothing would wake
    it once the earlier write finished. Each wake-up waits here until `position()` reaches its
    write's highest id, then goes out with every other one it reached."""

    __slots__ = ("_held", "_notifier", "_position")

    def __init__(self, notifier: Notifier, position: Callable[[], int]) -> None:
        self._notifier = notifier
        self._position = position
        self._held: list[tuple[int, set[str], set[str]]] = []

    def add(self, upto: int, rooms: Iterable[str], users: Iterable[str]) -> None:
        """Wake `rooms` and `users` once the position reaches `upto` (now, if it has)."""
        self._held.append((upto, set(rooms), set(users)))
        self.release()

    def release(self) -> None:
        """Send every held wake-up the position now covers."""
        if not self._held:
            return
        position = self._position()
        ready = [h for h in self._held if h[0] <= position]
        if not ready:
            return
        self._held = [h for h in self._held if h[0] > position]
        rooms: set[str] = set()
        users: set[str] = set()
        for _, held_rooms, held_users in ready:
            rooms |= held_rooms
            users |= held_users
        if rooms or users:
            self._notifier.notify(rooms, users)
