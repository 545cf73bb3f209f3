"""A persister restarted (SIGTERM, then started again) while writes to its rooms arrive at another
worker: the writes wait for it (bounded by `writer_wait_s`) and succeed, idempotent or not,
instead of answering 503; with no wait configured they fail with 503, as before."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.routing import writer_for_room


@pytest.mark.parametrize("wait_s", [10.0, 0.0])
async def test_writes_wait_for_a_restarting_persister(make_cluster: MakeCluster, wait_s: float) -> None:
    cluster = await make_cluster(
        persisters=2, sync_workers=1, background_workers=0, extra_config={"writer_wait_s": wait_s}
    )
    async with aiohttp.ClientSession() as session:
        alice = ClusterClient(session, cluster.urls)
        bob = ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        await bob.register("bob", via="sync1")
        room = await alice.create_room("public", via="sync1")
        owner = writer_for_room(room, cluster.event_writers)
        codes = await cluster.stop(names=[owner])
        assert codes == {owner: 0}
        started = time.monotonic()
        send = asyncio.create_task(alice.send(room, "m.room.message", {"body": "during"}, via="sync1"))
        join = asyncio.create_task(bob.membership(room, "join", via="sync1"))  # not idempotent
        await asyncio.sleep(1.0)
        await cluster.start([owner])
        outcomes = await asyncio.gather(send, join, return_exceptions=True)
        if wait_s:
            assert all(isinstance(o, dict) for o in outcomes), outcomes
            assert time.monotonic() - started < wait_s + 5
            body = await alice.messages(room, via="sync1", dir="b", limit=5)
            assert "during" in [e["content"].get("body") for e in body["chunk"]]
        else:
            assert all(isinstance(o, RequestRefused) and o.status == 503 for o in outcomes), outcomes
