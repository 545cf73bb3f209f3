"""The Delete Room API (versions 1 and 2) on worker processes: a purge taken by one worker and done
by the room's writer; the room is gone from every worker, also after each restarted; its former
members keep syncing and see it under `leave` once; a blocked room id cannot be joined, an
unblocked one is an unknown room; version 2's task status is answered by any worker."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
import pytest

from tests.analytics.reference import keys_of
from tests.cluster.conftest import MakeCluster
from tests.cluster.test_exposure import SECRET, admin_token, call
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.model import ROOM_PURGED_CACHE

ROOMS = "/_synapse/admin/v1/rooms"
ROOMS_V2 = "/_synapse/admin/v2/rooms"


def _sections(answer: dict[str, Any], room_id: str) -> list[str]:
    return [s for s, rooms in answer.get("rooms", {}).items() if room_id in rooms]


async def _left_once(client: ClusterClient, worker: str, since: str, room_id: str) -> None:
    """From `since` (taken while joined), the room comes under `leave` with the leave, then never again."""
    answer: dict[str, Any] = {}
    for _ in range(20):  # until this worker has the leave
        answer = await client.sync(worker, since, timeout_ms=500)
        if _sections(answer, room_id):
            break
    assert _sections(answer, room_id) == ["leave"], (worker, answer.get("rooms"))
    timeline = answer["rooms"]["leave"][room_id]["timeline"]["events"]
    assert timeline[-1]["type"] == "m.room.member" and timeline[-1]["state_key"] == client.user_id
    assert timeline[-1]["content"]["membership"] == "leave"
    after = await client.sync(worker, answer["next_batch"], timeout_ms=0)
    assert _sections(after, room_id) == [], worker


async def _gone_everywhere(cluster: LocalCluster, bob: ClusterClient, room_id: str, alias: str) -> None:
    for worker in cluster.urls:
        initial = await bob.sync(worker, filter='{"room": {"include_leave": true}}')
        assert _sections(initial, room_id) == [], worker
        with pytest.raises(RequestRefused) as joining:
            await bob.membership(room_id, "join", via=worker)
        assert (joining.value.status, joining.value.errcode) == (403, "M_FORBIDDEN"), worker
        url = f"{cluster.url(worker)}/_matrix/client/v3/directory/room/{quote(alias)}"
        status, _, _ = await call(bob.session, "GET", url, None, bob.token)
        assert status == 404, worker


async def test_a_purged_room_is_gone_from_every_worker_and_its_members_keep_syncing(
    make_cluster: MakeCluster, database_url: str
) -> None:
    cluster = await make_cluster(background_workers=0, extra_config={"registration_shared_secret": SECRET})
    async with aiohttp.ClientSession() as http:
        alice, bob = (ClusterClient(http, cluster.urls) for _ in range(2))
        await alice.register("alice", via="sync1")
        await bob.register("bob", via="sync1")
        root = await admin_token(http, cluster.url("sync1"), "root")
        room = await alice.create_room("public", via="persister1", room_alias_name="doomed")
        alias = "#doomed:localhost"
        await bob.membership(room, "join", via="sync2")
        for i in range(5):
            await alice.send(room, "m.room.message", {"body": f"m{i}"}, via=f"persister{1 + i % 2}")
        since = {w: (await bob.sync(w))["next_batch"] for w in cluster.sync_workers}
        for worker in cluster.sync_workers:
            assert _sections(await bob.sync(worker), room) == ["join"]

        url = f"{cluster.url('sync2')}{ROOMS}/{room}"
        status, refused, _ = await call(http, "DELETE", url, {}, bob.token)
        assert (status, refused["errcode"]) == (403, "M_FORBIDDEN")  # not an admin
        status, answer, _ = await call(http, "DELETE", url, {"block": True}, root)
        assert status == 200, answer
        assert answer == {
            "kicked_users": ["@alice:localhost", "@bob:localhost"],
            "failed_to_kick_users": [],
            "local_aliases": [alias],
            "new_room_id": None,
        }
        for worker in cluster.sync_workers:
            await _left_once(bob, worker, since[worker], room)
        await _gone_everywhere(cluster, bob, room, alias)

        conn = await asyncpg.connect(database_url)
        try:
            kept = await conn.fetch(
                "SELECT state_key FROM events WHERE room_id = $1 ORDER BY state_key", room
            )
            invalidations = await conn.fetch(
                "SELECT keys FROM cache_invalidation_stream_by_instance WHERE cache_func = $1"
                " AND keys[1] = $2",
                ROOM_PURGED_CACHE,
                room,
            )
        finally:
            await conn.close()
        assert [r["state_key"] for r in kept] == ["@alice:localhost", "@bob:localhost"]  # the leaves
        # One caches row: the room and its former members, each a key the audit counts.
        assert [list(r["keys"]) for r in invalidations] == [[room, "@alice:localhost", "@bob:localhost"]]
        assert keys_of(ROOM_PURGED_CACHE, list(invalidations[0]["keys"])) == [
            room, "@alice:localhost", "@bob:localhost",
        ]  # fmt: skip

        for worker in cluster.urls:
            await cluster.restart(worker)
        await _gone_everywhere(cluster, bob, room, alias)
        for worker in cluster.sync_workers:
            await _left_once(bob, worker, since[worker], room)
            page = await alice.sync(worker)
            assert _sections(page, room) == []


async def test_an_unblocked_purge_leaves_an_unknown_room_id_and_a_blocked_one_stays_shut(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(
        sync_workers=1, background_workers=0, extra_config={"registration_shared_secret": SECRET}
    )
    async with aiohttp.ClientSession() as http:
        alice = ClusterClient(http, cluster.urls)
        await alice.register("alice", via="sync1")
        root = await admin_token(http, cluster.url("sync1"), "root")
        peer = ClusterClient(http, cluster.urls, token=cluster.worker_secret)

        async def remote_invite(room_id: str) -> None:
            invite = {"room_version": "10", "event": {"type": "m.room.member", "sender": "@z:far.test",
                      "state_key": "@alice:localhost", "content": {"membership": "invite"}}}  # fmt: skip
            url = f"{cluster.url('sync1')}/_matrix/federation/v2/invite/{quote(room_id)}/$i{room_id[1:6]}"
            await peer._call("PUT", url, invite)

        room = await alice.create_room("public", via="sync1")
        url = f"{cluster.url('sync1')}{ROOMS}/{room}"
        status, answer, _ = await call(http, "DELETE", url, {"block": "yes"}, root)
        assert (status, answer["errcode"]) == (400, "M_BAD_JSON")
        status, answer, _ = await call(http, "DELETE", url, {}, root)
        assert status == 200 and answer["kicked_users"] == ["@alice:localhost"], answer
        with pytest.raises(RequestRefused) as joining:
            await alice.membership(room, "join", via="sync1")
        assert (joining.value.status, joining.value.errcode) == (404, "M_NOT_FOUND")
        status, answer, _ = await call(http, "DELETE", url, {}, root)  # nothing left to purge
        assert (status, answer["errcode"]) == (400, "M_BAD_JSON")
        await remote_invite(room)  # the id is free: another server's room may take it
        await alice.membership(room, "join", via="sync1")

        shut = await alice.create_room("public", via="sync1")
        status, answer, _ = await call(
            http, "DELETE", f"{cluster.url('sync1')}{ROOMS}/{shut}", {"block": True}, root
        )
        assert status == 200 and answer["kicked_users"] == ["@alice:localhost"]
        never = "!never:localhost"  # version 1 blocks an id this server never knew
        status, answer, _ = await call(
            http, "DELETE", f"{cluster.url('sync1')}{ROOMS}/{never}", {"block": True}, root
        )
        assert status == 200 and answer["kicked_users"] == []
        for blocked in (shut, never):
            with pytest.raises(RequestRefused) as joining:
                await alice.membership(blocked, "join", via="sync1")
            assert (joining.value.status, joining.value.errcode) == (403, "M_FORBIDDEN")
            with pytest.raises(RequestRefused) as inviting:
                await remote_invite(blocked)
            assert inviting.value.status == 403


async def test_version_2_runs_the_deletion_as_a_task_any_worker_reports(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(background_workers=0, extra_config={"registration_shared_secret": SECRET})
    async with aiohttp.ClientSession() as http:
        alice = ClusterClient(http, cluster.urls)
        await alice.register("alice", via="sync1")
        root = await admin_token(http, cluster.url("sync1"), "root")
        room = await alice.create_room("public", via="sync1", room_alias_name="task")
        url = f"{cluster.url('sync1')}{ROOMS_V2}/{room}"
        async with http.delete(url, headers={"Authorization": f"Bearer {root}"}) as resp:
            assert (resp.status, (await resp.json())["errcode"]) == (400, "M_NOT_JSON")  # {} at least
        status, started, _ = await call(http, "DELETE", url, {}, root)
        assert status == 200 and isinstance(started["delete_id"], str), started
        delete_id = started["delete_id"]
        expected = {
            "kicked_users": ["@alice:localhost"], "failed_to_kick_users": [],
            "local_aliases": ["#task:localhost"], "new_room_id": None,
        }  # fmt: skip
        for worker in cluster.urls:  # any worker answers for the task
            task: dict[str, Any] = {}
            for _ in range(100):
                status, task, _ = await call(
                    http, "GET", f"{cluster.url(worker)}{ROOMS_V2}/delete_status/{delete_id}", None, root
                )
                if task.get("status") == "complete":
                    break
                await asyncio.sleep(0.1)
            assert task == {"status": "complete", "shutdown_room": expected}, (worker, task)
            status, listed, _ = await call(
                http, "GET", f"{cluster.url(worker)}{ROOMS_V2}/{room}/delete_status", None, root
            )
            assert listed == {"results": [{"delete_id": delete_id, **task}]}, worker
        status, refused, _ = await call(http, "DELETE", url, {}, root)  # gone: version 2 cannot block it
        assert (status, refused["errcode"]) == (404, "M_NOT_FOUND")
        status, refused, _ = await call(
            http, "GET", f"{cluster.url('sync2')}{ROOMS_V2}/delete_status/nope", None, root
        )
        assert status == 404
        with pytest.raises(RequestRefused) as joining:
            await alice.membership(room, "join", via="sync2")
        assert joining.value.status == 404
