"""A `since` token ahead of this worker: wait until the worker covers it, clamp one that nothing
can reach.

Tokens are global facts (a position of a writer), so a client may move between sync workers; the
worker it moves to is behind the one it left by a replication delay. `CatchUp.reach` waits for
that first (`LIKELY_DELAY_S`), and reads the sequences only for a token still beyond this worker:
a component beyond every value ever handed out (a database restore, a forgery) is clamped, never
refused with a 400, and the client's next `next_batch` never moves below the clamped token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from idgen import MultiWriterIdGenerator, SyncToken
from pubsub.ratelog import RateLimitedLog
from workers.handlers.notify.notifier import Notifier

log = logging.getLogger(__name__)

#: How far behind another worker this one usually is: a `since` beyond this worker's token is
#: waited for this long before the sequences are read to see whether it can be reached at all.
LIKELY_DELAY_S = 0.25


def covered(since: SyncToken, now: SyncToken, streams: tuple[str, ...]) -> bool:
    """Whether `now` covers `since` on the components that order tokens (`streams`)."""
    return all(since.get(s).is_before_or_eq(now.get(s)) for s in streams)


class CatchUp:
    """`reach(since, within_s)`: `since`, clamped where nothing can reach it, once the worker's
    token (`current`) covers it; None when that did not happen within `within_s`."""

    def __init__(
        self,
        current: Callable[[], SyncToken],
        generators: Mapping[str, MultiWriterIdGenerator],
        streams: tuple[str, ...],
        notifier: Notifier,
        clamped: Callable[[], None],
    ) -> None:
        self._current = current
        self._generators = generators
        self._streams = streams
        self._notifier = notifier
        self._clamped = clamped
        self._ratelog = RateLimitedLog(log)

    async def reach(self, since: SyncToken, within_s: float) -> SyncToken | None:
        started = time.monotonic()
        if not await self._wait(since, min(within_s, LIKELY_DELAY_S)):
            since = await self._bounded(since)
            if not await self._wait(since, within_s - (time.monotonic() - started)):
                return None
        return since

    async def _bounded(self, since: SyncToken) -> SyncToken:
        """`since` with each component beyond its sequence clamped to it (one read per such
        component; none for a component this worker knows was handed out)."""
        now = self._current()
        maxima: dict[str, int] = {}
        for stream in self._streams:
            component, generator = since.get(stream), self._generators.get(stream)
            if generator is None or component.is_before_or_eq(now.get(stream)):
                continue
            if component.get_max_stream_pos() > generator.known_allocated_token():
                maxima[stream] = await generator.get_max_allocated_token()
        bounded = since.bound(maxima)
        if bounded != since:
            self._clamped()
            self._ratelog.warning("clamped", "a since token beyond every sequence was clamped: %s", since)
        return bounded

    async def _wait(self, since: SyncToken, within_s: float) -> bool:
        """Wait until this worker's token covers `since`, at most `within_s` (a `timeout=0`
        client is answered at once)."""
        deadline = time.monotonic() + within_s
        while not covered(since, self._current(), self._streams):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self._notifier.wait_for_position(min(remaining, 0.5))
        return True
