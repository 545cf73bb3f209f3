"""A sync worker's side of presence: count the /sync requests in flight per (user, device).

The hook for the /sync endpoint: wrap each request in `async with tracker.syncing(user, device):`
(or call `enter` before and `exit` after, in a `finally`). The tracker then:

* sends `USER_SYNC <instance_id> <user> <device> start <now>` when the pair's first sync starts;
* on the last one's end, waits `end_delay_s`: a new sync in that time cancels the end (clients
  reconnect between long-polls; without this every poll would flap start/end), else
  `USER_SYNC ... end <when it stopped>` goes out (`send_due_ends`, run periodically);
* `starts()` lists a start for every pair currently syncing (or in its end delay): re-sent after
  each (re)subscription, when the presence writer restarted, and periodically as the process's
  keep-alive;
* `clear()` is the `CLEAR_USER_SYNC <instance_id>` of a graceful shutdown.

`instance_id` must be new for every process start (`new_instance_id`).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from pubsub.wire import ClearUserSync, UserSync

log = logging.getLogger(__name__)
Send = Callable[[UserSync | ClearUserSync], Awaitable[None]]
Pair = tuple[str, str | None]


def new_instance_id(instance_name: str) -> str:
    """`<instance_name>-<8 random hex digits>`: readable in logs, never reused by a later start."""
    return f"{instance_name}-{secrets.token_hex(4)}"


class PresenceSyncTracker:
    """Counts syncs per (user, device); see the module docstring for what it sends and when.

    The counting (`enter`, `exit`, `due_ends`, `starts`) is pure and takes the time in ms; the
    async helpers send through `send` (a failed send is logged: the periodic re-send and the
    writer's process expiry bound the damage).
    """

    def __init__(self, instance_id: str, send: Send, end_delay_s: float = 10.0) -> None:
        self.instance_id = instance_id
        self.end_delay_ms = end_delay_s * 1000
        self._send = send
        self._active: dict[Pair, int] = {}
        self._stopping: dict[Pair, float] = {}  # pair -> when its last sync ended

    # -- pure counting ----------------------------------------------------------------------------

    def enter(self, user_id: str, device_id: str | None, now_ms: float) -> UserSync | None:
        """A sync starts; returns the USER_SYNC start to send, if any."""
        pair = (user_id, device_id)
        count = self._active.get(pair, 0)
        self._active[pair] = count + 1
        if count > 0:
            return None
        if self._stopping.pop(pair, None) is not None:
            return None  # it stopped a moment ago and the writer was never told: nothing changed
        return UserSync(self.instance_id, user_id, device_id, "start", int(now_ms))

    def exit(self, user_id: str, device_id: str | None, now_ms: float) -> None:
        pair = (user_id, device_id)
        count = self._active.get(pair, 0) - 1
        if count > 0:
            self._active[pair] = count
            return
        self._active.pop(pair, None)
        if count == 0:
            self._stopping[pair] = now_ms

    def due_ends(self, now_ms: float) -> list[UserSync]:
        """The ends whose delay is over (removed from the tracker)."""
        due = [(pair, at) for pair, at in self._stopping.items() if now_ms - at >= self.end_delay_ms]
        for pair, _at in due:
            del self._stopping[pair]
        return [UserSync(self.instance_id, u, d, "end", int(at)) for (u, d), at in sorted(due, key=str)]

    def starts(self, now_ms: float) -> list[UserSync]:
        """A start for every pair the writer should believe is syncing here."""
        pairs = sorted({*self._active, *self._stopping}, key=str)
        return [UserSync(self.instance_id, u, d, "start", int(now_ms)) for u, d in pairs]

    def clear(self) -> ClearUserSync:
        return ClearUserSync(self.instance_id)

    @property
    def syncing(self) -> int:
        return len(self._active)

    # -- the edge -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def sync_request(self, user_id: str, device_id: str | None) -> AsyncIterator[None]:
        """Wrap one /sync request (see the module docstring)."""
        start = self.enter(user_id, device_id, _now_ms())
        if start is not None:
            await self._send_logged(start)
        try:
            yield
        finally:
            self.exit(user_id, device_id, _now_ms())

    async def send_due_ends(self) -> None:
        for command in self.due_ends(_now_ms()):
            await self._send_logged(command)

    async def resend_starts(self) -> None:
        for command in self.starts(_now_ms()):
            await self._send_logged(command)

    async def send_clear(self) -> None:
        await self._send_logged(self.clear())

    async def _send_logged(self, command: UserSync | ClearUserSync) -> None:
        try:
            await self._send(command)
        except Exception as e:
            log.warning("could not send %s instance_id=%s: %s", type(command).__name__, self.instance_id, e)


def _now_ms() -> float:
    return time.time() * 1000
