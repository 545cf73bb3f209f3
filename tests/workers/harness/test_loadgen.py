"""The load driver's bookkeeping, on a real worker: a device whose key upload or claim failed keeps
its key count out of the check, whatever succeeds after; events written by concurrent actors all
count in the report's throughput; a failed check keeps what it judged."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker
from workers.harness import churn
from workers.harness.cluster_client import RequestRefused
from workers.harness.load_check import keep_for_diagnosis
from workers.harness.loadgen import LoadDriver, LoadPlan


@contextlib.asynccontextmanager
async def _driver(make_worker: MakeWorker, database_url: str) -> AsyncIterator[LoadDriver]:
    """A load driver of two users and one room on one real worker that takes every role."""
    worker = await make_worker("w", ["w"])
    urls = {"w": f"http://127.0.0.1:{worker.http_port}"}
    async with aiohttp.ClientSession() as session:
        yield LoadDriver(session, urls, ["w"], ["w"], database_url, LoadPlan(users=2, rooms=1))


async def test_a_failed_claim_keeps_the_device_uncertain_after_a_later_claim_succeeds(
    make_worker: MakeWorker, database_url: str
) -> None:
    """A claim whose answer is lost may have handed a key out (a persister killed mid-claim did,
    in a CI run: the count then read one lower than the driver's own tally). A later claim that
    succeeds settles nothing about the earlier one."""
    async with _driver(make_worker, database_url) as driver:
        owner, claimer = driver._client(), driver._client()
        await owner.register("keys-owner")
        await driver._client_chore("keys_upload", owner, [])
        device = (str(owner.user_id), str(owner.device_id))
        assert device not in driver.keys_uncertain
        with pytest.raises(RequestRefused):  # not registered yet: the claim fails
            await driver._client_chore("keys_claim", claimer, [])
        assert device in driver.keys_uncertain
        await claimer.register("keys-claimer")
        await driver._client_chore("keys_claim", claimer, [])
        assert len(driver.keys_claimed[device]) == 1
        assert device in driver.keys_uncertain


async def test_events_written_meanwhile_count_beside_a_churn(
    make_worker: MakeWorker, database_url: str
) -> None:
    """A churn takes several requests; the messages other actors send meanwhile count too. The
    report's events/s is the demo's throughput: a tally held across the churn's awaits lost them
    (the demo's 16 actors reported 1,254 events; counted as stored, the same load is about 2,400)."""
    async with _driver(make_worker, database_url) as driver:
        await driver.setup()
        owner, churner = driver.clients
        for _ in range(3):
            await asyncio.gather(
                driver._act("churn", churner), *(driver._act("message", owner) for _ in range(8))
            )
        report = driver.report
        assert report.rejected == report.failed == 0
        assert report.events_sent == 3 * 8 + report.membership_changes


async def test_a_failed_check_keeps_what_it_judged(
    make_worker: MakeWorker, database_url: str, tmp_path: Path
) -> None:
    """A check with problems keeps them, the readers' recorded syncs and the stored events they were
    checked against (as `verify_load` reads them), where the demo, the container scenarios and the
    restore drill put it."""
    async with _driver(make_worker, database_url) as driver:
        await driver.setup()
        await driver._act("message", driver.clients[0])
        driver.report.problems.append("an injected problem")
        kept = await keep_for_diagnosis(driver, tmp_path, "after")
    assert [p.name for p in kept] == ["problems after.txt", "histories after.json", "events after.json"]
    assert kept[0].read_text() == "an injected problem\n"
    histories = json.loads(kept[1].read_text())
    assert len(histories) == 3 and set(histories) == {
        str(r.client.user_id) for r in driver.readers + driver.probes
    }
    events = json.loads(kept[2].read_text())
    assert {"m.room.create", "m.room.message"} <= {e["type"] for e in events}
    assert {"stream_ordering", "instance_name", "event_id", "membership", "visibility"} <= set(events[0])


def test_churn_knocks_only_on_the_knock_room_and_joins_it_invited_or_vouched() -> None:
    assert ("me", "knock") not in churn.moves(None, knock_room=False, vouched=False)
    assert ("me", "join") not in churn.moves("leave", knock_room=True, vouched=False)
    assert {("me", "join"), ("me", "knock")} <= set(churn.moves("leave", knock_room=True, vouched=True))
    assert ("me", "join") in churn.moves("invite", knock_room=True, vouched=False)
    first, fallback = churn.knock_room_rules(["!space:hs"])
    assert first == {
        "join_rule": "knock_restricted",
        "allow": [{"type": "m.room_membership", "room_id": "!space:hs"}],
    }
    assert fallback == {"join_rule": "knock"}
