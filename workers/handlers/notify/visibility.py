"""Read-your-writes: a worker that had another worker write for its client waits until its own
token covers that write before it answers, so the client's next request here sees it.

Bounded: after `VISIBLE_WAIT_S`, or at once while this worker does not hear the writer live (its
Redis link is down, so waiting is pointless), the caller answers anyway and counts it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from workers.handlers.notify.notifier import Notifier

VISIBLE_WAIT_S = 10.0


class WriterPositions(Protocol):
    """What this worker knows of each writer's position (an ID generator)."""

    def get_current_token_for_writer(self, instance_name: str) -> int: ...


async def wait_visible(
    positions: WriterPositions,
    instance: str,
    stream_id: int,
    notifier: Notifier,
    hears: Callable[[str], bool],
    within_s: float = VISIBLE_WAIT_S,
) -> bool:
    """Wait until `positions` has `instance` at `stream_id` or beyond; False if it gave up."""
    deadline = time.monotonic() + within_s
    while positions.get_current_token_for_writer(instance) < stream_id:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not hears(instance):
            return False
        await notifier.wait_for_position(min(remaining, 0.5))
    return True
