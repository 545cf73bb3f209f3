"""Any worker serves any request, also one with `serve_reads: false`: real processes, where the
persisters keep no replicated view and relay every read to the sync worker."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster_client import ClusterClient, RequestRefused, timeline_events

C = "/_matrix/client/v3"


async def test_reads_on_a_worker_that_serves_none_are_relayed(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(
        persisters=2, sync_workers=1, background_workers=0, write_only_persisters=True
    )
    async with aiohttp.ClientSession() as session:
        alice = ClusterClient(session, cluster.urls)
        await alice.register("alice", via="persister1")
        room = await alice.create_room("public", via="persister1")
        first = await alice.sync("persister1")  # relayed: the persister has no view of its own
        assert room in first["rooms"]["join"]
        since = first["next_batch"]

        # A long-poll relayed from persister2 wakes when a message is sent through persister1.
        poll = asyncio.create_task(alice.sync("persister2", since, 20_000))
        await asyncio.sleep(0.5)
        assert not poll.done()
        started = time.monotonic()
        await alice.send(room, "m.room.message", {"body": "hello"}, via="persister1")
        woken = await asyncio.wait_for(poll, 15)
        assert time.monotonic() - started < 10
        assert [e["content"] for e in timeline_events(woken) if e["type"] == "m.room.message"] == [
            {"body": "hello"}
        ]

        # Read-your-writes through one write-only worker: the reader waits for its positions.
        for i in range(5):
            await alice.send(room, "m.room.message", {"n": i}, via="persister2")
            page = await alice.messages(room, via="persister2", dir="b", limit=1)
            assert page["chunk"][0]["content"] == {"n": i}
        state = await alice.room_state(room, via="persister1")
        assert any(e["type"] == "m.room.create" for e in state)

        # Clients spread over persister1's candidates (persister2, sync1): persister2 serves no reads,
        # refuses the relay once (421), and is asked last from then on; every read is answered.
        for i in range(12):
            other = ClusterClient(session, cluster.urls)
            await other.register(f"spread{i}", via="sync1")
            assert "next_batch" in await other.sync("persister1")
        async with session.get(cluster.url("persister1") + "/metrics") as resp:
            metrics = await resp.text()
        refused = 'fanout_worker_requests_total{endpoint="relay_read",outcome="refused"} 1.0'
        assert refused in metrics

        # The reader's errors come back unchanged: its errcode, its status.
        for path, status, errcode in [
            (f"{C}/sync?since=garbage", 400, "M_INVALID_PARAM"),
            (f"{C}/rooms/!nosuch:localhost/state", 403, "M_FORBIDDEN"),
        ]:
            async with session.get(
                cluster.url("persister1") + path, headers={"Authorization": f"Bearer {alice.token}"}
            ) as resp:
                assert (resp.status, (await resp.json())["errcode"]) == (status, errcode)
        async with session.get(
            cluster.url("persister1") + f"{C}/sync", headers={"Authorization": "Bearer nope"}
        ) as resp:
            assert (resp.status, (await resp.json())["errcode"]) == (401, "M_UNKNOWN_TOKEN")

        # With no reading worker left, a read answers 503 with Retry-After (the client retries).
        cluster.kill("sync1")
        try:
            await alice.sync("persister1", since)
            raise AssertionError("a read with no reader answered 200")
        except RequestRefused as refused:
            assert refused.status == 503 and refused.errcode == "M_UNKNOWN"
            assert "serve_reads" in refused.body["error"]
        await cluster.start(["sync1"])
        assert room in (await alice.sync("persister2"))["rooms"]["join"]
