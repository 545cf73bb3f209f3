"""workers.process.previous_release: the periodic check survives whatever the database throws at
it, a stuck connection's InternalClientError included, and stops cleanly."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from workers.process.previous_release import PreviousRelease


async def test_a_stuck_connection_does_not_end_the_check(
    db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend ended while its connection sat idle leaves asyncpg stuck ("another operation (2)
    is in progress"): the check logs it and looks again at the next interval. It used to end the
    loop for good, and the shutdown step that stops it then failed with the same error (exit 1)."""
    check = PreviousRelease(db_pool, "prefix-unused", interval_s=0.01)
    looks = 0
    real = check.check

    async def flaky() -> bool:
        nonlocal looks
        looks += 1
        if looks <= 2:
            raise asyncpg.InternalClientError(
                "cannot switch to state 12; another operation (2) is in progress"
            )
        return await real()

    monkeypatch.setattr(check, "check", flaky)
    check.start()
    for _ in range(200):
        if looks >= 4:
            break
        await asyncio.sleep(0.01)
    assert looks >= 4
    await check.stop()
    assert check.live is False
