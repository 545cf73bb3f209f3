"""cancel_and_wait: shutdown must end a task even when a cancellation is lost inside it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pubsub.tasks import cancel_and_wait


async def _swallows_first_cancel(woken: list[str]) -> None:
    """Behaves like the subscriber after Python 3.11's wait_for dropped a cancel: it goes on waiting."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        woken.append("swallowed")
    await asyncio.Event().wait()


async def test_a_task_that_swallows_a_cancel_is_cancelled_again() -> None:
    woken: list[str] = []
    task = asyncio.create_task(_swallows_first_cancel(woken))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, every_s=0.05), 5)
    assert woken == ["swallowed"]
    assert task.cancelled()


async def test_ended_and_failed_tasks_are_waited_for_without_raising(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails() -> None:
        raise ValueError("boom")

    async def waits() -> None:
        await asyncio.Event().wait()

    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    running = asyncio.create_task(waits())
    with caplog.at_level(logging.WARNING, logger="pubsub.tasks"):
        await cancel_and_wait(failed, running)
    assert "had failed: ValueError('boom')" in caplog.text
    assert running.cancelled()
    assert isinstance(failed.exception(), ValueError)
    await cancel_and_wait()
