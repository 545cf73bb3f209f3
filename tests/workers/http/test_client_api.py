"""The client API of in-process workers on real Postgres and Redis: auth, rules, errors, batching."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import RequestRefused
from workers.routing import writer_for_room


async def test_register_auth_and_bad_bodies(make_worker: MakeWorker, http: aiohttp.ClientSession) -> None:
    worker = await make_worker("p1", ["p1"])
    base = f"http://127.0.0.1:{worker.http_port}"
    client = client_for(http, [worker], ["p1"])
    await client.register("@alice")
    with pytest.raises(RequestRefused) as taken:
        await client_for(http, [worker], ["p1"]).register("@alice")
    assert taken.value.status == 409
    auth = {"Authorization": f"Bearer {client.token}"}
    cases = [
        ("POST", "/register", b"{not json", {}, 400, "NOT_JSON"),
        ("POST", "/register", b"[1, 2]", {}, 400, "BAD_JSON"),
        ("POST", "/register", b'{"user_id": "no at sign"}', {}, 400, "BAD_USER_ID"),
        ("POST", "/createRoom", b"{}", {}, 401, "MISSING_TOKEN"),
        ("POST", "/createRoom", b"{}", {"Authorization": "Bearer nope"}, 401, "UNKNOWN_TOKEN"),
        ("POST", "/createRoom", b'{"join_rule": "anyone"}', auth, 400, "BAD_JOIN_RULE"),
        ("GET", "/sync?since=garbage", None, auth, 400, "BAD_TOKEN"),
        ("GET", "/sync?since=m1~99.5", None, auth, 400, "BAD_TOKEN"),
        ("GET", "/sync?timeout=soon", None, auth, 400, "BAD_TIMEOUT"),
        ("POST", "/rooms/!nosuch/send/m.room.message", b"{}", auth, 404, "NOT_FOUND"),
        ("POST", "/rooms/bad room/send/x", b"{}", auth, 400, "BAD_ROOM_ID"),
    ]  # fmt: skip
    for method, path, body, headers, status, errcode in cases:
        async with http.request(method, base + path, data=body, headers=headers) as resp:
            payload = await resp.json()
            assert (resp.status, payload["errcode"]) == (status, errcode), (path, payload)
    # The worker kept serving through all of that.
    assert (await client.sync("p1"))["events"] == []


async def test_content_that_cannot_be_stored_is_refused_alone(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """A lone surrogate, NaN or an overflowing number cannot be stored as JSON text: each such send
    gets a 400 while the sends batched with it are persisted."""
    worker = await make_worker("p1", ["p1"])
    base = f"http://127.0.0.1:{worker.http_port}"
    client = client_for(http, [worker], ["p1"])
    await client.register("@alice")
    room = await client.create_room("public")
    since = (await client.sync("p1"))["next_batch"]
    auth = {"Authorization": f"Bearer {client.token}"}

    async def send_raw(body: bytes) -> tuple[int, str]:
        async with http.post(f"{base}/rooms/{room}/send/m.room.message", data=body, headers=auth) as resp:
            return resp.status, (await resp.json()).get("errcode", "")

    bad = [b'{"body": "\\ud800"}', b'{"n": NaN}', b'{"n": [1e999]}', b'{"n": -Infinity}']
    results = await asyncio.gather(
        *(client.send(room, "m.room.message", {"n": i, "s": '"\\\n\u2028'}) for i in range(20)),
        *(send_raw(body) for body in bad),
    )
    assert list(results[20:]) == [
        (400, "NOT_JSON"), (400, "NOT_JSON"), (400, "BAD_JSON"), (400, "NOT_JSON")
    ]  # fmt: skip
    seen = (await client.sync("p1", since, 1000))["events"]
    assert sorted(e["content"]["n"] for e in seen) == list(range(20))
    assert {e["content"]["s"] for e in seen} == {'"\\\n\u2028'}


async def test_user_cannot_read_or_enter_another_users_room(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"])
    alice, bob = client_for(http, [worker], ["p1"]), client_for(http, [worker], ["p1"])
    await alice.register("@alice")
    await bob.register("@bob")
    bob_since = (await bob.sync("p1"))["next_batch"]
    room = await alice.create_room("invite")
    await alice.send(room, "m.room.message", {"body": "secret"})
    for attempt in (
        bob.room_state(room, "p1"),
        bob.membership(room, "join"),
        bob.send(room, "m.room.message", {"body": "let me in"}),
        bob.membership(room, "invite", target="@bob"),
    ):
        with pytest.raises(RequestRefused) as refused:
            await attempt
        assert refused.value.status == 403
    assert (await bob.sync("p1", bob_since, 300))["events"] == []
    # Once invited and joined, bob sees the room from his join on, never what came before.
    await alice.membership(room, "invite", target="@bob")
    await bob.membership(room, "join")
    await alice.send(room, "m.room.message", {"body": "welcome"})
    seen = (await bob.sync("p1", bob_since, 1000))["events"]
    assert [e["content"].get("body", e["content"].get("membership")) for e in seen] == [
        "invite",
        "join",
        "welcome",
    ]
    assert len(await bob.room_state(room, "p1")) == 4


async def test_wrong_writer_is_redirected_and_non_writer_refuses(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    p1 = await make_worker("p1", ["p1", "p2"])
    p2 = await make_worker("p2", ["p1", "p2"])
    reader = await make_worker("r1", ["p1", "p2"])
    client = client_for(http, [p1, p2, reader], ["p1", "p2"])
    await client.register("@alice")
    room = await client.create_room("public")
    owner = client.owner_url(room)
    other = next(url for url in client.urls.values() if url != owner)
    auth = {"Authorization": f"Bearer {client.token}"}
    async with http.post(f"{other}/rooms/{room}/send/m.room.message", json={}, headers=auth) as resp:
        body = await resp.json()
    assert resp.status == 421 and body["errcode"] in ("WRONG_WRITER", "NOT_A_WRITER")


async def test_backfill_never_reaches_the_live_timeline(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"])
    client = client_for(http, [worker], ["p1"])
    await client.register("@alice")
    since = (await client.sync("p1"))["next_batch"]
    room = await client.create_room("public")
    orderings = await client.backfill(room, [{"type": "m.room.message", "content": {"body": f"old {i}"}}
                                             for i in range(3)])  # fmt: skip
    assert orderings == [-1, -2, -3]
    await client.send(room, "m.room.message", {"body": "new"})
    events = (await client.sync("p1", since, 500))["events"]
    assert [e["content"].get("body") for e in events if e["type"] == "m.room.message"] == ["new"]
    assert all(e["stream_ordering"] > 0 for e in events)


async def test_concurrent_sends_share_batches(make_worker: MakeWorker, http: aiohttp.ClientSession) -> None:
    worker = await make_worker("p1", ["p1"])
    client = client_for(http, [worker], ["p1"])
    await client.register("@alice")
    room = await client.create_room("public")
    before = worker.persister.batches if worker.persister else 0
    results = await asyncio.gather(*(client.send(room, "m.room.message", {"n": i}) for i in range(200)))
    orderings = [r["stream_ordering"] for r in results]
    assert len(set(orderings)) == 200
    assert worker.persister is not None and worker.persister.batches - before < 200
    async with worker.pool.acquire() as conn:
        stored = await conn.fetchval("SELECT count(*) FROM events WHERE type = 'm.room.message'")
        positions = await conn.fetchval("SELECT stream_id FROM stream_positions WHERE stream_name = 'events'")
    assert stored == 200 and positions >= max(orderings)


async def test_health_and_metrics(make_worker: MakeWorker, http: aiohttp.ClientSession) -> None:
    worker = await make_worker("p1", ["p1"])
    base = f"http://127.0.0.1:{worker.http_port}"
    async with http.get(f"{base}/health") as resp:
        health = await resp.json()
    assert resp.status == 200 and health["ready"] and health["replication"]["subscribed"]
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    assert "fanout_events_persisted_total" in text and "fanout_repl" in text


async def test_reader_records_the_caches_rows_it_applied(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    persister = await make_worker("p1", ["p1"])
    reader = await make_worker("r1", ["p1"])
    client = client_for(http, [persister, reader], ["p1"])
    await client.register("@alice")
    room = await client.create_room("public")
    for i in range(5):
        await client.set_state(room, "m.room.topic", "", {"topic": str(i)})
    async with persister.pool.acquire() as conn:
        published = await conn.fetchval(
            "SELECT max(stream_id) FROM cache_invalidation_stream_by_instance WHERE instance_name = 'p1'"
        )
    assert reader.applied is not None
    for _ in range(400):  # up to 20 s: a reader that lost a line catches up at the writer's next POSITION
        await reader.applied.flush()
        async with reader.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT from_id, to_id FROM replication_applied_ranges WHERE worker_name = 'r1'"
                " AND stream_name = 'caches' AND instance_name = 'p1'"
            )
        if row is not None and row["to_id"] >= published:
            break
        await asyncio.sleep(0.05)
    assert row is not None and row["from_id"] == 0 and row["to_id"] >= published


async def test_write_only_persisters_follow_positions_and_serve_no_reads(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """`serve_reads: false` (how LocalCluster and compose run persisters): the worker applies no
    other writer's rows, only follows positions; that is enough for an idle writer to announce
    positions that let readers' persisted-upto pass the busy writer's events."""
    p1 = await make_worker("p1", ["p1", "p2"], serve_reads=False)
    p2 = await make_worker("p2", ["p1", "p2"], serve_reads=False)
    reader = await make_worker("r1", ["p1", "p2"])
    client = client_for(http, [p1, p2, reader], ["p1", "p2"])
    await client.register("@alice", via="r1")
    auth = {"Authorization": f"Bearer {client.token}"}
    for worker in (p1, p2):
        for path in ("/sync", "/rooms/!abc/state"):
            async with http.get(f"http://127.0.0.1:{worker.http_port}{path}", headers=auth) as resp:
                assert (resp.status, (await resp.json())["errcode"]) == (421, "NOT_A_READER")
    since = (await client.sync("r1"))["next_batch"]
    room = await client.create_room("public")
    owner, idle = (p1, p2) if writer_for_room(room, ["p1", "p2"]) == "p1" else (p2, p1)
    sent = [(await client.send(room, "m.room.message", {"n": i}))["stream_ordering"] for i in range(20)]
    seen: list[int] = []
    while len(seen) < 20:
        result = await client.sync("r1", since, 2000)
        since = result["next_batch"]
        seen += [e["content"]["n"] for e in result["events"] if e["type"] == "m.room.message"]
    assert seen == list(range(20))
    reader_events = reader.generators["events"]
    for _ in range(100):  # the idle writer's announcements move persisted-upto past the busy one's rows
        if reader_events.get_current_token() >= sent[-1]:
            break
        await asyncio.sleep(0.05)
    assert reader_events.get_current_token() >= sent[-1]
    assert idle.generators["events"].get_current_token_for_writer(owner.name) >= sent[-1]
    assert idle.replication.metrics.value("fanout_repl_rejected_total") == 0
    assert idle.registry.get_sample_value("fanout_events_applied_total") == 0
    assert idle.applied is None and owner.applied is None  # the audit's record is the readers'


async def test_the_rules_see_every_change_the_writer_committed(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """The writer caches the state its rules read (`RoomViews`); each committed change must reach the
    next check: a leave, a kick, a ban, a join rule, a room that did not exist yet."""
    worker = await make_worker("p1", ["p1"])
    alice, bob, carol = (client_for(http, [worker], ["p1"]) for _ in range(3))
    for client, name in ((alice, "@alice"), (bob, "@bob"), (carol, "@carol")):
        await client.register(name)
    room = await alice.create_room("public")
    await bob.membership(room, "join")
    await bob.send(room, "m.room.message", {"body": "hi"})  # bob's view is cached: joined
    await bob.membership(room, "leave")
    with pytest.raises(RequestRefused) as refused:
        await bob.send(room, "m.room.message", {"body": "still here?"})
    assert refused.value.status == 403
    await carol.membership(room, "join")
    await alice.membership(room, "leave", target="@carol")  # kicked
    with pytest.raises(RequestRefused):
        await carol.send(room, "m.room.message", {})
    await alice.membership(room, "ban", target="@bob")
    with pytest.raises(RequestRefused):
        await bob.membership(room, "join")
    await alice.set_state(room, "m.room.join_rules", "", {"join_rule": "invite"})
    with pytest.raises(RequestRefused):
        await carol.membership(room, "join")
    await alice.set_state(room, "m.room.join_rules", "", {"join_rule": "public"})
    await carol.membership(room, "join")
    await carol.send(room, "m.room.message", {"body": "back"})
    assert worker.room_views.rooms.hits > 0 and worker.room_views.memberships.hits > 0
