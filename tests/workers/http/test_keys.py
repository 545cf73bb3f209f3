"""One-time and fallback keys over the Matrix API on several in-process workers: uploads and claims
go to a device_lists writer from whichever worker is asked; /keys/upload and /sync tell the device
its counts as committed, on every worker, however late replication is."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from tests.compat.previous_worker import previous_release_worker
from tests.workers.conftest import MakeWorker, client_for
from tests.workers.http.test_stored_streams import refused
from workers.app import Worker
from workers.harness.cluster_client import ClusterClient
from workers.harness.faultproxy import FaultProxy, target_of, through
from workers.process.previous_release import CHECK_INTERVAL_S
from workers.routing import writer_for_user
from workers.storage import one_time_keys as key_store
from workers.streams.device_lists import DEVICE_LISTS

WRITERS = ["p1", "p2"]
C = "/_matrix/client/v3"
ALG = "signed_curve25519"


def one_time_keys(first: int, count: int, tag: str = "k") -> dict[str, Any]:
    return {f"{ALG}:K{n:04d}": {"key": f"{tag}{n}", "signatures": {}} for n in range(first, first + count)}


async def upload(client: ClusterClient, via: str, **body: Any) -> dict[str, int]:
    answer = await client._call("POST", f"{client.urls[via]}{C}/keys/upload", body)
    counts: dict[str, int] = answer["one_time_key_counts"]
    return counts


async def claim(client: ClusterClient, via: str, wanted: dict[str, dict[str, str]]) -> dict[str, Any]:
    answer: dict[str, Any] = await client._call(
        "POST", f"{client.urls[via]}{C}/keys/claim", {"one_time_keys": wanted}
    )
    return answer


async def sync_counts(worker: Worker, client: ClusterClient) -> tuple[dict[str, int], list[str] | None]:
    """What /sync's stored sections tell `client`'s device of its keys on `worker`."""
    assert worker.sync is not None and worker.sync.stored is not None and client.user_id and client.device_id
    rooms = await worker.caches.rooms_for_user.get(client.user_id)
    now = worker.sync.current_token()
    updates, _ = await worker.sync.stored.collect(client.user_id, client.device_id, rooms, now, now, [])
    assert not updates and not updates.one_time_key_counts  # a poll that parks reads no counts
    await worker.sync.stored.add_key_counts(updates, client.user_id, client.device_id)
    assert not updates  # counts are no news: they never end a long-poll by themselves
    return updates.one_time_key_counts, updates.unused_fallback_key_types


async def counted(worker: Worker, client: ClusterClient, expected: tuple[dict[str, int], list[str]]) -> None:
    """`worker`'s /sync tells `client`'s device `expected` now (the counts are read where exact)."""
    assert await sync_counts(worker, client) == expected


async def test_upload_counts_conflicts_claims_and_fallback(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice, bob = (client_for(http, workers, WRITERS) for _ in range(2))
    await alice.register("alice", via="r1")
    await bob.register("bob", via="r1")
    assert bob.user_id and bob.device_id
    reader = workers[2]
    assert writer_for_user(bob.user_id, WRITERS, DEVICE_LISTS) != "r1"  # the upload is forwarded
    assert await upload(bob, "r1") == {ALG: 0}
    assert await sync_counts(reader, bob) == ({ALG: 0}, [])
    fallback = {f"{ALG}:F1": {"key": "f1", "fallback": True, "signatures": {}}}
    counts = await upload(bob, "r1", one_time_keys=one_time_keys(0, 3), fallback_keys=fallback)
    assert counts == {ALG: 3}
    assert await sync_counts(reader, bob) == ({ALG: 3}, [ALG])
    # The same keys again change nothing; a held key id with other content is refused, whole.
    assert await upload(bob, "p1", one_time_keys=one_time_keys(0, 3)) == {ALG: 3}
    changed = {**one_time_keys(3, 1), **one_time_keys(0, 1, tag="other")}
    assert await refused(upload(bob, "r1", one_time_keys=changed)) == (400, "M_UNKNOWN")
    assert await upload(bob, "r1", one_time_keys={"curve25519:X": "plain"}) == {ALG: 3, "curve25519": 1}
    for bad in ({"nocolon": {}}, {f"{ALG}:K": 5}, ["list"]):
        assert await refused(upload(bob, "r1", one_time_keys=bad)) == (400, "M_BAD_JSON")
    # Claims: each one-time key once, then the fallback key (marked used, handed out again).
    wanted = {bob.user_id: {bob.device_id: ALG}}
    got = [await claim(alice, via, wanted) for via in ("r1", "p2", "p1", "r1", "p2")]
    keys = [next(iter(g["one_time_keys"][bob.user_id][bob.device_id])) for g in got]
    assert keys == [f"{ALG}:K0000", f"{ALG}:K0001", f"{ALG}:K0002", f"{ALG}:F1", f"{ALG}:F1"]
    assert got[3]["one_time_keys"][bob.user_id][bob.device_id][f"{ALG}:F1"] == fallback[f"{ALG}:F1"]
    await counted(reader, bob, ({ALG: 0, "curve25519": 1}, []))  # the last claim went through p2
    # A new fallback key is unused again; the same one uploaded again stays used.
    await upload(bob, "r1", fallback_keys=fallback)
    assert (await sync_counts(reader, bob))[1] == []
    await upload(bob, "r1", fallback_keys={f"{ALG}:F2": {"key": "f2", "fallback": True}})
    assert (await sync_counts(reader, bob))[1] == [ALG]
    # Unknown devices, algorithms without keys and remote users get nothing; remote servers fail.
    nothing = await claim(
        alice, "r1", {bob.user_id: {"NODEVICE": ALG}, alice.user_id or "": {alice.device_id or "": ALG},
                      "@carol:elsewhere": {"D": ALG}},
    )  # fmt: skip
    assert nothing["one_time_keys"] == {} and set(nothing["failures"]) == {"elsewhere"}
    assert await refused(claim(alice, "r1", {"not-a-user": {}})) == (400, "M_INVALID_PARAM")
    # Deleting the device deletes its keys.
    async with reader.pool.acquire() as conn:
        await conn.execute("DELETE FROM devices WHERE user_id = $1", bob.user_id)
        assert await conn.fetchval("SELECT count(*) FROM e2e_one_time_keys") == 0
        assert await conn.fetchval("SELECT count(*) FROM e2e_fallback_keys") == 0


async def test_two_workers_claiming_at_once_get_each_key_once(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, ["p1"]) for n in ("p1", "r1")]
    alice, bob = (client_for(http, workers, ["p1"]) for _ in range(2))
    await alice.register("alice", via="r1")
    await bob.register("bob", via="r1")
    assert bob.user_id and bob.device_id
    keys = 120
    assert await upload(bob, "p1", one_time_keys=one_time_keys(0, keys)) == {ALG: keys}
    fallback = {f"{ALG}:F": {"key": "f", "fallback": True}}
    await upload(bob, "p1", fallback_keys=fallback)
    wanted = {bob.user_id: {bob.device_id: ALG}}
    claims = 150  # more than there are keys: the last ones get the fallback key
    got = await asyncio.gather(*(claim(alice, ("p1", "r1")[n % 2], wanted) for n in range(claims)))
    handed = [next(iter(g["one_time_keys"][bob.user_id][bob.device_id])) for g in got]
    one_time = [k for k in handed if k != f"{ALG}:F"]
    assert sorted(one_time) == sorted(one_time_keys(0, keys))  # every key, each exactly once
    assert handed.count(f"{ALG}:F") == claims - keys
    await counted(workers[1], bob, ({ALG: 0}, []))


async def test_a_claim_answered_200_shows_in_the_owners_next_answers_on_any_worker(
    make_worker: MakeWorker, http: aiohttp.ClientSession, redis_url: str
) -> None:
    """Read-your-writes across workers and users: once a claim is answered, the key owner's next
    `/keys/upload` and /sync on another worker tell the count after it, even while that worker
    hears replication two seconds late (the claim's caches-stream row is still on its way)."""
    async with FaultProxy(*target_of(redis_url)) as proxy:
        writer = await make_worker("p1", ["p1"])
        reader = await make_worker("r1", ["p1"], redis_url=through(redis_url, proxy))
        workers = [writer, reader]
        alice, bob = (client_for(http, workers, ["p1"]) for _ in range(2))
        await alice.register("alice", via="r1")
        await bob.register("bob", via="r1")
        assert bob.user_id and bob.device_id
        await upload(bob, "p1", one_time_keys=one_time_keys(0, 4))
        assert await upload(bob, "r1") == {ALG: 4}
        await counted(reader, bob, ({ALG: 4}, []))
        proxy.delay(2.0)
        wanted = {bob.user_id: {bob.device_id: ALG}}
        for left in (3, 2, 1):
            await claim(alice, "p1", wanted)
            assert await upload(bob, "r1") == {ALG: left}
            await counted(reader, bob, ({ALG: left}, []))
        proxy.delay(0.0)


async def test_a_claim_made_in_the_database_by_the_previous_release_shows_at_once(
    make_worker: MakeWorker, http: aiohttp.ClientSession, database_url: str, channel_prefix: str
) -> None:
    """The previous release claims in the database without a caches-stream row (its writers know no
    `claim_keys`): /sync and /keys/upload tell the count after it all the same, with and without
    one of its workers running."""
    workers = [await make_worker(n, ["p1"]) for n in ("p1", "r1")]
    reader = workers[1]
    bob = client_for(http, workers, ["p1"])
    await bob.register("bob", via="r1")
    assert bob.user_id and bob.device_id
    await upload(bob, "p1", one_time_keys=one_time_keys(0, 3))
    await counted(reader, bob, ({ALG: 3}, []))

    async def claim_as_previous_release() -> None:
        async with reader.pool.acquire() as conn:
            assert bob.user_id and bob.device_id
            assert len(await key_store.claim_keys(conn, [(bob.user_id, bob.device_id, ALG)])) == 1

    await claim_as_previous_release()
    await counted(reader, bob, ({ALG: 2}, []))
    async with previous_release_worker(database_url, f"{channel_prefix}/old1"):
        assert reader.previous_release is not None
        deadline = time.monotonic() + CHECK_INTERVAL_S * 3
        while not reader.previous_release.live:
            assert time.monotonic() < deadline, "compatibility mode never started"
            await asyncio.sleep(0.05)
        await claim_as_previous_release()
        await counted(reader, bob, ({ALG: 1}, []))
        assert await upload(bob, "r1") == {ALG: 1}
