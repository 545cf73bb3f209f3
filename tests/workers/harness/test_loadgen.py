"""The load driver's bookkeeping of outcomes it cannot know, on a real worker: a device whose key
upload or claim failed keeps its key count out of the check, whatever succeeds after."""

from __future__ import annotations

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker
from workers.harness.cluster_client import RequestRefused
from workers.harness.loadgen import LoadDriver, LoadPlan


async def test_a_failed_claim_keeps_the_device_uncertain_after_a_later_claim_succeeds(
    make_worker: MakeWorker, database_url: str
) -> None:
    """A claim whose answer is lost may have handed a key out (a persister killed mid-claim did,
    in a CI run: the count then read one lower than the driver's own tally). A later claim that
    succeeds settles nothing about the earlier one."""
    worker = await make_worker("w", ["w"])
    urls = {"w": f"http://127.0.0.1:{worker.http_port}"}
    async with aiohttp.ClientSession() as session:
        driver = LoadDriver(session, urls, ["w"], ["w"], database_url, LoadPlan(users=2, rooms=1))
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
