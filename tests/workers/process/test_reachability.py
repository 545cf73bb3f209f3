"""workers.process.reachability: the probe keeps its last outcome, an outcome observed elsewhere
(the previous-release check's read) stands for its own statement, and its own `SELECT 1` comes
back when those outcomes stop. Deadlines, not sleeps: each loop is waited for until it has done
what is asserted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import pytest

from workers.process import reachability
from workers.process.previous_release import PreviousRelease
from workers.process.reachability import PostgresProbe

PERIOD_S = 0.2


async def _until(done: Callable[[], bool], within_s: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not done():
        assert loop.time() < deadline, "not done within the deadline"
        await asyncio.sleep(0.02)


@pytest.fixture(autouse=True)
def _fast_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reachability, "MIN_INTERVAL_S", PERIOD_S)


async def test_the_previous_release_check_stands_for_the_probe(db_pool: asyncpg.Pool) -> None:
    previous = PreviousRelease(db_pool, "prefix-unused", interval_s=PERIOD_S)
    probe = PostgresProbe(db_pool, PERIOD_S)
    previous.on_outcome = probe.observe
    previous.start()
    probe.start()
    try:
        await _until(lambda: probe.observed >= 3)
        assert probe.error is None
        assert probe.probes < probe.observed
    finally:
        await probe.stop()
        await previous.stop()


async def test_the_probe_runs_again_when_the_observed_outcomes_stop(db_pool: asyncpg.Pool) -> None:
    probe = PostgresProbe(db_pool, PERIOD_S)
    probe.observe("connection refused")
    assert probe.error == "connection refused"
    probe.start()
    try:
        await _until(lambda: probe.probes >= 1)
        await _until(lambda: probe.error is None)  # its own SELECT 1 reached the server
        assert probe.observed >= 1  # the observed outcome stood for the first probe
    finally:
        await probe.stop()


async def test_the_check_tells_an_unreachable_server_but_not_a_servers_own_error(
    db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous = PreviousRelease(db_pool, "prefix-unused", interval_s=PERIOD_S)
    told: list[str | None] = []
    previous.on_outcome = told.append
    failures: list[Exception] = [
        OSError("connection refused"),
        asyncpg.exceptions.UndefinedTableError("no such table"),
    ]

    async def check() -> bool:
        if failures:
            raise failures.pop(0)
        return False

    monkeypatch.setattr(previous, "check", check)
    previous.start()
    try:
        await _until(lambda: len(told) >= 2)
    finally:
        await previous.stop()
    assert told[0] == "connection refused"
    assert told[1] is None  # the server's own error was not told; the next check's success was
