"""Stopping asyncio tasks so that shutdown cannot hang on a lost cancellation."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

RECANCEL_EVERY_S = 0.5


async def cancel_and_wait(*tasks: asyncio.Task[Any], every_s: float = RECANCEL_EVERY_S) -> None:
    """Cancel `tasks` and wait until every one has ended, cancelling again every `every_s` those
    that run on. An exception a task ended with is logged, not raised: stopping goes on.

    One cancellation is not always enough. On Python 3.11 `asyncio.wait_for` drops a cancel that
    arrives as the future it awaits completes (rewritten in 3.12). After a Redis restart a trace
    caught this in the subscriber task: the task went back to reading its socket and shutdown hung
    for good (rare: the fault test hung once in CI and once in about 300 runs here). The next
    cancel reaches the task in that read.
    """
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=every_s)
        for task in pending:
            log.info(
                "task %s still running %.1fs after a cancel; cancelling it again", task.get_name(), every_s
            )
    for task in tasks:
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("task %s had failed: %r", task.get_name(), error)
