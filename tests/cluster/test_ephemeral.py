"""Typing, presence and worker requests between real worker processes."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import RequestRefused

WRITER = "background1"
FAST_PRESENCE = {
    "presence_process_timeout_s": 2.0,
    "presence_offline_grace_s": 0.5,
    "presence_keepalive_s": 0.5,
    "user_sync_end_delay_s": 0.5,
}


async def internal(cluster: LocalCluster, name: str, method: str, path: str, body: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {cluster.worker_secret}"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"{cluster.url(name)}/_fanout/internal{path}", json=body, headers=headers
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def metric(cluster: LocalCluster, name: str, family: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(f"{cluster.url(name)}/metrics") as resp:
        text = await resp.text()
    return sum(
        sample.value
        for fam in text_string_to_metric_families(text)
        for sample in fam.samples
        if sample.name == family and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def eventually(check: Callable[[], Any], within_s: float = 15.0) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def ephemeral_cluster(make_cluster: MakeCluster) -> LocalCluster:
    return await make_cluster(
        persisters=1, sync_workers=2, background_workers=1,
        stream_writers={"typing": [WRITER], "presence": [WRITER]}, extra_config=FAST_PRESENCE,
    )  # fmt: skip


async def test_typing_across_workers_and_one_resync_after_the_writer_is_killed(
    make_cluster: MakeCluster,
) -> None:
    cluster = await ephemeral_cluster(make_cluster)
    await internal(cluster, WRITER, "PUT", "/typing/!r:x/@u:x", {"typing": True, "timeout": 30_000})

    async def typing_on(name: str) -> Any:
        return await internal(cluster, name, "GET", "/typing/!r:x")

    await eventually(lambda: _users_are(typing_on("sync2"), ["@u:x"]))
    fetches = "fanout_ephemeral_catch_up_fetches_total"
    pubsub_fetches = "fanout_ephemeral_repl_catch_up_fetches_total"  # pubsub's own count
    before = await metric(cluster, "sync2", fetches, stream="typing")
    pubsub_before = await metric(cluster, "sync2", pubsub_fetches, stream="typing")

    cluster.kill(WRITER)  # SIGKILL: its typing state is gone
    await cluster.start([WRITER])
    # The reader resyncs from the new writer's (empty) snapshot: the room's typing ends.
    await eventually(lambda: _users_are(typing_on("sync2"), []))
    await asyncio.sleep(2.0)  # ten announce intervals: later POSITIONs must not fetch again
    assert await metric(cluster, "sync2", fetches, stream="typing") - before == 1
    assert await metric(cluster, "sync2", pubsub_fetches, stream="typing") - pubsub_before == 1
    assert await metric(cluster, "sync2", fetches, stream="typing", answer="reset") >= 1
    reader_token = (await typing_on("sync2"))["token"]
    assert reader_token <= (await typing_on(WRITER))["token"]  # a token the writer can serve

    await internal(cluster, WRITER, "PUT", "/typing/!r:x/@v:x", {"typing": True, "timeout": 30_000})
    await eventually(lambda: _users_are(typing_on("sync1"), ["@v:x"]))


async def _users_are(view: Any, users: list[str]) -> bool:
    return bool((await view)["user_ids"] == users)


async def test_sigterm_sends_clear_user_sync_and_a_restart_has_a_new_instance_id(
    make_cluster: MakeCluster, redis_url: str, channel_prefix: str
) -> None:
    cluster = await ephemeral_cluster(make_cluster)
    first = (await internal(cluster, "sync1", "GET", "/instance"))["instance_id"]
    assert first.startswith("sync1-")
    subscriber = aioredis.Redis.from_url(redis_url)
    pubsub = subscriber.pubsub()
    await pubsub.subscribe(channel_prefix)
    try:
        process = cluster.workers["sync1"].process
        assert process is not None
        process.send_signal(signal.SIGTERM)
        wanted = f"CLEAR_USER_SYNC {first}".encode()
        deadline = time.monotonic() + 15
        seen = False
        while not seen and time.monotonic() < deadline:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            seen = message is not None and wanted in message["data"]
        assert seen, "no CLEAR_USER_SYNC for the stopping worker"
        assert await asyncio.to_thread(process.wait, 15) == 0
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await subscriber.aclose()
    await cluster.start(["sync1"])
    second = (await internal(cluster, "sync1", "GET", "/instance"))["instance_id"]
    assert second.startswith("sync1-") and second != first


async def test_the_users_of_a_killed_syncing_process_go_offline_after_the_expiry(
    make_cluster: MakeCluster, redis_url: str, channel_prefix: str
) -> None:
    cluster = await ephemeral_cluster(make_cluster)
    syncing = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.cluster.syncing_process",
        redis_url,
        channel_prefix,
        "sync9",
        "@k:x",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert syncing.stdout is not None
        instance_id = (await asyncio.wait_for(syncing.stdout.readline(), 30)).decode().strip()
        assert instance_id.startswith("sync9-")

        async def presence() -> str:
            return str((await internal(cluster, WRITER, "GET", "/presence/@k:x"))["presence"])

        await eventually(lambda: _is(presence(), "online"))
        await asyncio.sleep(2.5)  # beyond the process timeout: its keep-alives hold the user online
        assert await presence() == "online"
        syncing.kill()  # no CLEAR_USER_SYNC
        killed = time.monotonic()
        await eventually(lambda: _is(presence(), "offline"))
        assert time.monotonic() - killed >= 1.0  # by the expiry (2 s after its last keep-alive)
    finally:
        if syncing.returncode is None:
            syncing.kill()
        await syncing.wait()


async def _is(value: Any, expected: str) -> bool:
    return bool(await value == expected)


async def test_typing_and_presence_through_the_matrix_api_reach_sync_on_another_worker(
    make_cluster: MakeCluster,
) -> None:
    """Alice types on sync1; bob, long-polling on sync2, gets m.typing in the room's ephemeral
    events, then the typing stop. Syncing makes alice online for bob (USER_SYNC to the presence
    writer), and her status message arrives as an m.presence event."""
    from workers.harness.cluster_client import ClusterClient

    cluster = await ephemeral_cluster(make_cluster)
    async with aiohttp.ClientSession() as session:
        alice, bob = ClusterClient(session, cluster.urls), ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        await bob.register("bob", via="sync2")
        room = await alice.create_room("public", via="sync1")
        await bob.membership(room, "join", via="sync2")
        since = (await bob.sync("sync2"))["next_batch"]
        typing_url = f"{cluster.url('sync1')}/_matrix/client/v3/rooms/{room}/typing/{alice.user_id}"
        await alice._call("PUT", typing_url, {"typing": True, "timeout": 30_000})

        async def typing_seen(expected: list[str]) -> bool:
            nonlocal since
            result = await bob.sync("sync2", since, 2000)
            since = result["next_batch"]
            room_body = result["rooms"]["join"].get(room, {})
            events = room_body.get("ephemeral", {}).get("events", [])
            return any(e["type"] == "m.typing" and e["content"]["user_ids"] == expected for e in events)

        assert await eventually(lambda: typing_seen([str(alice.user_id)]))
        await alice._call("PUT", typing_url, {"typing": False})
        assert await eventually(lambda: typing_seen([]))
        with pytest.raises(RequestRefused) as other:  # only your own typing
            await bob._call("PUT", typing_url, {"typing": True, "timeout": 1000})
        assert other.value.status == 403

        await alice.sync("sync1")  # a sync: alice is online
        status_url = f"{cluster.url('sync1')}/_matrix/client/v3/presence/{alice.user_id}/status"
        await alice._call("PUT", status_url, {"presence": "online", "status_msg": "tea"})

        async def presence_seen() -> bool:
            nonlocal since
            result = await bob.sync("sync2", since, 2000)
            since = result["next_batch"]
            return any(
                e["type"] == "m.presence"
                and e["sender"] == alice.user_id
                and e["content"].get("status_msg") == "tea"
                for e in result["presence"]["events"]
            )

        assert await eventually(presence_seen)
        seen = await bob._call("GET", status_url.replace(cluster.url("sync1"), cluster.url("sync2")))
        assert seen["presence"] == "online" and seen["status_msg"] == "tea"


async def test_keys_query_for_a_remote_user_goes_through_the_device_list_writer(
    make_cluster: MakeCluster,
) -> None:
    """A reader never fetches a remote user's devices itself: it asks the device-list writer, which
    asks the user's server (a stand-in for federation, run here) once, stores the list, and answers.
    A stale mark makes the next query resync it."""
    from aiohttp import web

    from workers.embedded.services import free_port
    from workers.harness.cluster_client import ClusterClient

    fetched: list[str] = []

    async def user_devices(request: web.Request) -> web.Response:
        fetched.append(request.match_info["user_id"])
        keys = {"user_id": "@bob:remote.test", "device_id": "BOBPHONE", "algorithms": ["m.olm.v1"],
                "keys": {"ed25519:BOBPHONE": "key"}}  # fmt: skip
        return web.json_response({"user_id": "@bob:remote.test", "stream_id": 1,
                                  "devices": [{"device_id": "BOBPHONE", "keys": keys}]})  # fmt: skip

    remote = web.Application()
    remote.router.add_get("/_matrix/federation/v1/user/devices/{user_id}", user_devices)
    runner = web.AppRunner(remote)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        cluster = await make_cluster(
            persisters=1, sync_workers=2, background_workers=1,
            stream_writers={"device_lists": [WRITER]},
            extra_config={"remote_servers": {"remote.test": f"http://127.0.0.1:{port}"}},
        )  # fmt: skip
        async with aiohttp.ClientSession() as session:
            alice = ClusterClient(session, cluster.urls)
            await alice.register("alice", via="sync1")
            query = {"device_keys": {"@bob:remote.test": [], "@nobody:elsewhere.test": []}}
            url = "/_matrix/client/v3/keys/query"
            first = await alice._call("POST", cluster.url("sync1") + url, query)
            assert first["device_keys"]["@bob:remote.test"]["BOBPHONE"]["keys"] == {"ed25519:BOBPHONE": "key"}
            assert (
                "elsewhere.test" in first["failures"] and first["device_keys"]["@nobody:elsewhere.test"] == {}
            )
            again = await alice._call("POST", cluster.url("sync2") + url, query)
            assert again["device_keys"]["@bob:remote.test"] == first["device_keys"]["@bob:remote.test"]
            assert fetched == ["@bob:remote.test"]  # once, cached for the second reader
            stale = f"{cluster.url('sync2')}/_fanout/admin/v1/device_lists/@bob:remote.test/stale"
            await alice._call("POST", stale, {})
            await alice._call("POST", cluster.url("sync2") + url, query)
            assert fetched == ["@bob:remote.test"] * 2
        # Every resync went through the writer: bob twice, the unreachable user on each of 3 queries.
        sent = [
            await metric(cluster, name, "fanout_worker_requests_total", endpoint="device_lists_resync")
            for name in ("sync1", "sync2")
        ]
        assert sent == [2, 3]
    finally:
        await runner.cleanup()
