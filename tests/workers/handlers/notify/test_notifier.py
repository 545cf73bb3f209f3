"""workers.handlers.notify.notifier: only the concerned long-polls wake."""

from __future__ import annotations

import asyncio

from workers.handlers.notify.notifier import Notifier


async def test_notifier_wakes_only_concerned_waiters() -> None:
    notifier = Notifier()
    with notifier.waiter("@a", frozenset({"!r1"})) as a, notifier.waiter("@b", frozenset({"!r2"})) as b:
        assert notifier.notify({"!r1"}, set()) == 1
        assert a.woken and not b.woken
        assert notifier.notify(set(), {"@b"}) == 1
        assert await b.wait(0.01)
    assert notifier.waiting == 0


async def test_a_waiter_times_out_or_is_woken_while_waiting() -> None:
    notifier = Notifier()
    with notifier.waiter("@a", frozenset({"!r1"})) as a:
        assert not await a.wait(0.01)
        waiting = asyncio.create_task(a.wait(5))
        await asyncio.sleep(0)
        notifier.notify({"!r1"}, set())
        assert await asyncio.wait_for(waiting, 1) and a.woken_at > 0
