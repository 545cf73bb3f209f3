"""workers.handlers.notifier: only the concerned long-polls wake."""

from __future__ import annotations

from workers.handlers.notifier import Notifier


async def test_notifier_wakes_only_concerned_waiters() -> None:
    notifier = Notifier()
    with notifier.waiter("@a", frozenset({"!r1"})) as a, notifier.waiter("@b", frozenset({"!r2"})) as b:
        assert notifier.notify({"!r1"}, set()) == 1
        assert a.event.is_set() and not b.event.is_set()
        assert notifier.notify(set(), {"@b"}) == 1
        assert await b.wait(0.01)
    assert notifier.waiting == 0
