"""The client API of in-process workers on real Postgres and Redis: errors, bodies, batching,
health, and the room rules (the Matrix endpoints in detail: test_accounts, test_rooms, test_sync)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker, client_for
from workers.assembly.generators import EVENTS_POSITION_DELAY_S
from workers.harness.cluster_client import RequestRefused, timeline_events
from workers.routing import writer_for_room

C = "/_matrix/client/v3"


async def test_every_error_is_a_spec_errcode_and_the_worker_keeps_serving(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"])
    base = f"http://127.0.0.1:{worker.http_port}"
    client = client_for(http, [worker], ["p1"])
    await client.register("alice")
    auth = {"Authorization": f"Bearer {client.token}"}
    dummy = b'"auth": {"type": "m.login.dummy"}'
    cases = [
        ("POST", f"{C}/register", b"{not json", {}, 400, "M_NOT_JSON"),
        ("POST", f"{C}/register", b"[1, 2]", {}, 400, "M_BAD_JSON"),
        ("POST", f"{C}/register", b'{"username": "No Spaces", ' + dummy + b"}", {}, 400,
         "M_INVALID_USERNAME"),
        ("POST", f"{C}/register", b'{"username": "alice", ' + dummy + b"}", {}, 400, "M_USER_IN_USE"),
        ("POST", f"{C}/register?kind=guest", b"{}", {}, 403, "M_GUEST_ACCESS_FORBIDDEN"),
        ("POST", f"{C}/login", b'{"type": "m.login.password", "identifier": {"type": "m.id.user",'
                               b' "user": "alice"}, "password": "wrong"}', {}, 403, "M_FORBIDDEN"),
        ("POST", f"{C}/login", b'{"type": "m.login.token"}', {}, 400, "M_UNKNOWN"),
        ("POST", f"{C}/createRoom", b"{}", {}, 401, "M_MISSING_TOKEN"),
        ("POST", f"{C}/createRoom", b"{}", {"Authorization": "Bearer nope"}, 401, "M_UNKNOWN_TOKEN"),
        ("POST", f"{C}/createRoom", b'{"preset": "anyone"}', auth, 400, "M_BAD_JSON"),
        ("POST", f"{C}/createRoom", b'{"room_version": "0"}', auth, 400, "M_UNSUPPORTED_ROOM_VERSION"),
        ("GET", f"{C}/sync?since=garbage", None, auth, 400, "M_INVALID_PARAM"),
        ("GET", f"{C}/sync?since=m1~99.5", None, auth, 400, "M_INVALID_PARAM"),
        ("GET", f"{C}/sync?timeout=soon", None, auth, 400, "M_INVALID_PARAM"),
        ("GET", f"{C}/sync?filter=%7Bbad", None, auth, 400, "M_BAD_JSON"),
        ("GET", f"{C}/sync?filter=42", None, auth, 404, "M_NOT_FOUND"),
        ("PUT", f"{C}/rooms/!nosuch:localhost/send/m.room.message/t1", b"{}", auth, 404, "M_NOT_FOUND"),
        ("PUT", f"{C}/rooms/bad%20room/send/m.room.message/t1", b"{}", auth, 400, "M_INVALID_PARAM"),
        ("POST", f"{C}/rooms/!nosuch:localhost/invite", b"{}", auth, 400, "M_MISSING_PARAM"),
        ("GET", f"{C}/no/such/endpoint", None, auth, 404, "M_UNRECOGNIZED"),
        ("DELETE", f"{C}/createRoom", None, auth, 405, "M_UNRECOGNIZED"),
        ("PUT", f"{C}/rooms/!r:localhost/send/m.room.message/t1", b'{"a": "' + b"x" * 70_000 + b'"}',
         auth, 413, "M_TOO_LARGE"),
    ]  # fmt: skip
    for method, path, body, headers, status, errcode in cases:
        async with http.request(method, base + path, data=body, headers=headers) as resp:
            payload = await resp.json()
            assert (resp.status, payload["errcode"]) == (status, errcode), (path, payload)
            assert isinstance(payload["error"], str) and payload["error"]
    # The worker kept serving through all of that.
    assert (await client.sync("p1"))["rooms"]["join"] == {}


async def test_content_that_cannot_be_stored_is_refused_alone(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """A lone surrogate, NaN or an overflowing number cannot be stored as JSON text: each such send
    gets a 400 while the sends batched with it are persisted."""
    worker = await make_worker("p1", ["p1"])
    base = f"http://127.0.0.1:{worker.http_port}"
    client = client_for(http, [worker], ["p1"])
    await client.register("alice")
    room = await client.create_room("public")
    since = (await client.sync("p1"))["next_batch"]
    auth = {"Authorization": f"Bearer {client.token}"}

    async def send_raw(i: int, body: bytes) -> tuple[int, str]:
        url = f"{base}{C}/rooms/{room}/send/m.room.message/raw{i}"
        async with http.put(url, data=body, headers=auth) as resp:
            return resp.status, (await resp.json()).get("errcode", "")

    bad = [b'{"body": "\\ud800"}', b'{"n": NaN}', b'{"n": [1e999]}', b'{"n": -Infinity}']
    results = await asyncio.gather(
        *(client.send(room, "m.room.message", {"n": i, "s": '"\\\n\u2028'}) for i in range(20)),
        *(send_raw(i, body) for i, body in enumerate(bad)),
    )
    assert list(results[20:]) == [
        (400, "M_NOT_JSON"), (400, "M_NOT_JSON"), (400, "M_BAD_JSON"), (400, "M_NOT_JSON")
    ]  # fmt: skip
    seen = [e for e in timeline_events(await client.sync("p1", since, 1000)) if e["type"] == "m.room.message"]
    assert sorted(e["content"]["n"] for e in seen) == list(range(20))
    assert {e["content"]["s"] for e in seen} == {'"\\\n\u2028'}


async def test_concurrent_sends_share_batches(make_worker: MakeWorker, http: aiohttp.ClientSession) -> None:
    worker = await make_worker("p1", ["p1"])
    client = client_for(http, [worker], ["p1"])
    await client.register("alice")
    room = await client.create_room("public")
    before = worker.persister.batches if worker.persister else 0
    results = await asyncio.gather(*(client.send(room, "m.room.message", {"n": i}) for i in range(200)))
    assert len({r["event_id"] for r in results}) == 200
    assert worker.persister is not None and worker.persister.batches - before < 200
    async with worker.pool.acquire() as conn:
        stored = await conn.fetchval("SELECT count(*) FROM events WHERE type = 'm.room.message'")
        top = await conn.fetchval("SELECT max(stream_ordering) FROM events")
        deadline = time.monotonic() + EVENTS_POSITION_DELAY_S * 4  # the row may lag the writes this long
        position = 0
        while position < top and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            position = await conn.fetchval(
                "SELECT stream_id FROM stream_positions WHERE stream_name = 'events'"
            )
    assert stored == 200 and position >= top


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
    await client.register("alice")
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
    """`serve_reads: false`: the worker applies no other writer's rows but the caches stream's (it
    caches access tokens), only follows positions;
    that is enough for an idle writer to announce positions that let readers' persisted-upto pass
    the busy writer's events. It still takes writes (forwarding them to the room's owner); a read it
    cannot relay (no reading worker in its instance_map) answers 503 naming the settings."""
    p1 = await make_worker("p1", ["p1", "p2"], serve_reads=False)
    p2 = await make_worker("p2", ["p1", "p2"], serve_reads=False)
    reader = await make_worker("r1", ["p1", "p2"])
    client = client_for(http, [p1, p2, reader], ["p1", "p2"])
    await client.register("alice", via="r1")
    auth = {"Authorization": f"Bearer {client.token}"}
    for worker in (p1, p2):
        for path in ("/sync", "/rooms/!abc:localhost/state"):
            async with http.get(f"http://127.0.0.1:{worker.http_port}{C}{path}", headers=auth) as resp:
                body = await resp.json()
                assert (resp.status, body["errcode"]) == (503, "M_UNKNOWN") and "serve_reads" in body["error"]
    since = (await client.sync("r1"))["next_batch"]
    room = await client.create_room("public", via="p1")
    owner, idle = (p1, p2) if writer_for_room(room, ["p1", "p2"]) == "p1" else (p2, p1)
    for i in range(20):
        await client.send(room, "m.room.message", {"n": i}, via=idle.name)  # forwarded to the owner
    seen: list[int] = []
    while len(seen) < 20:
        result = await client.sync("r1", since, 2000)
        since = result["next_batch"]
        seen += [e["content"]["n"] for e in timeline_events(result) if e["type"] == "m.room.message"]
    assert seen == list(range(20))
    async with owner.pool.acquire() as conn:
        top = await conn.fetchval("SELECT max(stream_ordering) FROM events")
    reader_events = reader.generators["events"]
    for _ in range(100):  # the idle writer's announcements move persisted-upto past the busy one's rows
        if reader_events.get_current_token() >= top:
            break
        await asyncio.sleep(0.05)
    assert reader_events.get_current_token() >= top
    assert idle.generators["events"].get_current_token_for_writer(owner.name) >= top
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
    for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
        await client.register(name)
    room = await alice.create_room("public")
    await bob.membership(room, "join")
    await bob.send(room, "m.room.message", {"body": "hi"})  # bob's view is cached: joined
    await bob.membership(room, "leave")
    with pytest.raises(RequestRefused) as refused:
        await bob.send(room, "m.room.message", {"body": "still here?"})
    assert (refused.value.status, refused.value.errcode) == (403, "M_FORBIDDEN")
    await carol.membership(room, "join")
    await alice.membership(room, "leave", target="carol")  # kicked
    with pytest.raises(RequestRefused):
        await carol.send(room, "m.room.message", {})
    await alice.membership(room, "ban", target="bob")
    with pytest.raises(RequestRefused):
        await bob.membership(room, "join")
    await alice.set_state(room, "m.room.join_rules", "", {"join_rule": "invite"})
    with pytest.raises(RequestRefused):
        await carol.membership(room, "join")


async def test_bad_requests_from_one_user_never_fail_another_users_good_ones(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """What PostgreSQL would refuse (a NUL in a state key, an event type or a device id) is refused
    at the edge with a 400, and the good requests sent at the same moment all succeed, once."""
    worker = await make_worker("p1", ["p1"])
    base = f"http://127.0.0.1:{worker.http_port}"
    mallory, *good = (client_for(http, [worker], ["p1"]) for _ in range(4))
    await mallory.register("mallory")
    for i, client in enumerate(good):
        await client.register(f"good{i}")
    room = await mallory.create_room("public")
    for client in good:
        await client.membership(room, "join")
    bad = {"Authorization": f"Bearer {mallory.token}"}

    async def status(method: str, path: str, body: object) -> int:
        async with http.request(method, base + path, json=body, headers=bad) as resp:
            return resp.status

    results = await asyncio.gather(
        *(c.send(room, "m.room.message", {"n": n}) for n in range(10) for c in good),
        status("PUT", f"{C}/rooms/{room}/state/m.room.topic/nul%00key", {"topic": "x"}),
        status("PUT", f"{C}/rooms/{room}/send/m.room%00message/t1", {}),
        status(
            "POST",
            f"{C}/login",
            {"type": "m.login.password", "user": "mallory", "password": "x", "device_id": "D\x00"},
        ),
        return_exceptions=True,
    )
    assert results[-3:] == [400, 400, 400]
    assert all(isinstance(r, dict) and r["event_id"] for r in results[:-3]), results[:-3]
    async with worker.pool.acquire() as conn:
        count = await conn.fetchval("SELECT count(*) FROM events WHERE type = 'm.room.message'")
    assert count == 30
