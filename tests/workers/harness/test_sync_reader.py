"""The recording /sync loop's start-over: a client whose token a real worker refuses starts over
with an initial sync (counted, outside the checked history) only when told to; else it fails."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker
from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.harness.sync_reader import SyncReader


async def _reader(session: aiohttp.ClientSession, url: str, start_over: bool) -> SyncReader:
    client = ClusterClient(session, {"w": url}, ["w"])
    await client.register("dora" if start_over else "eve")
    reader = SyncReader(client, ["w"], 1, start_over=start_over)
    reader.token = "not-a-token"  # what the worker refuses: 400 M_INVALID_PARAM
    return reader


async def test_a_refused_token_starts_the_reader_over_when_told_to(make_worker: MakeWorker) -> None:
    worker = await make_worker("w", ["w"])
    stop = asyncio.Event()
    stop.set()
    async with aiohttp.ClientSession() as session:
        reader = await _reader(session, f"http://127.0.0.1:{worker.http_port}", start_over=True)
        await reader.run(stop, lambda token: True, 0)

        assert reader.start_overs == ["w answered 400 M_INVALID_PARAM"]
        # The initial sync is not recorded; the sync after it is, from the token it returned.
        assert len(reader.records) == 1 and reader.records[0].since != "not-a-token"
        assert reader.token == reader.records[0].next_batch

        strict = await _reader(session, f"http://127.0.0.1:{worker.http_port}", start_over=False)
        with pytest.raises(RequestRefused) as refused:
            await strict.run(stop, lambda token: True, 0)
        assert refused.value.status == 400 and strict.start_overs == []
