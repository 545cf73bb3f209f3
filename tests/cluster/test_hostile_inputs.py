"""Issue 24's hostile inputs, replayed against a running cluster of real processes: forged and
malformed lines on the channel, requests PostgreSQL would refuse, oversized headers. Afterwards no
well-formed request got a 500, no log holds a traceback, and every acknowledged event is read
exactly once."""

from __future__ import annotations

import aiohttp

from tests.cluster.conftest import MakeCluster
from tests.pubsub.conftest import publish_raw
from workers.harness.cluster_client import ClusterClient, timeline_events

C = "/_matrix/client/v3"
FORGED_LINES = [
    b"POSITION events persister1 70 1000000000000000",  # under a running writer's own name
    b"POSITION events persister1 0 9223372036854775808",  # past 64 bits
    b"RDATA events persister1 999999 "
    + b'[0, 1, "$f", "!r:localhost", "m.room.message", "@x:localhost", null, null]',
    b'RDATA caches persister1 999998 [0, 1, "cs_cache_fake", ["!r:localhost"], 1]',
    b"RDATA events persister1 5 {not json",
    b"RDATA events persister1 6 [1, 2, 3]",
    b"POSITION events intruder 0 5",
]


async def test_hostile_inputs_harm_no_one(
    make_cluster: MakeCluster, redis_url: str, channel_prefix: str
) -> None:
    cluster = await make_cluster(persisters=2, sync_workers=1, background_workers=0)
    statuses: list[int] = []
    async with aiohttp.ClientSession() as session:
        alice = ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        room = await alice.create_room("public", via="sync1")
        since = (await alice.sync("sync1"))["next_batch"]
        auth = {"Authorization": f"Bearer {alice.token}"}
        await publish_raw(redis_url, channel_prefix, FORGED_LINES)
        hostile = [
            ("PUT", f"{C}/rooms/{room}/state/m.room.topic/nul%00key", {"topic": "x"}, auth),
            ("PUT", f"{C}/rooms/{room}/send/m.room.message/t%00x", {"body": "nul txn"}, auth),
            ("GET", f"{C}/sync?since=s1_m9223372036854775807~1.9223372036854775807", None, auth),
            ("GET", f"{C}/sync", None, {"Authorization": "Bearer " + "x" * 100_000}),
            ("POST", f"{C}/createRoom", {"preset": "public_chat", "name": "\ud800"}, auth),
        ]
        for method, path, body, headers in hostile:
            for url in cluster.urls.values():
                try:
                    async with session.request(method, url + path, json=body, headers=headers) as resp:
                        statuses.append(resp.status)
                except aiohttp.ClientError:
                    statuses.append(0)  # the server closed a request it would not read: fine
        # A persister restarted alone after the forged lines starts from the database, not Redis.
        await cluster.restart("persister1")
        for i in range(12):
            await alice.send(room, "m.room.message", {"n": i})
        got: list[int] = []
        for _ in range(30):
            result = await alice.sync("sync1", since, 1000)
            since = result["next_batch"]
            got += [e["content"]["n"] for e in timeline_events(result) if "n" in e["content"]]
            if len(got) >= 12:
                break
    assert got == list(range(12)), got
    assert 500 not in statuses, statuses
    for name in cluster.workers:
        log = cluster.log_tail(name, 10_000)
        assert "Traceback" not in log, (name, log[-3000:])
