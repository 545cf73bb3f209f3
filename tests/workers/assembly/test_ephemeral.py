"""Typing, presence and worker requests between in-process workers (real Postgres, Redis, HTTP)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from workers.app import Worker
from workers.config import WorkerConfig
from workers.embedded.services import free_port
from workers.handlers.placement.forwarding import ForwardRefused, OwnerUnavailable

SECRET = "s3cret-s3cret-s3cret"
MakeCluster = Callable[..., Awaitable[dict[str, Worker]]]


@pytest.fixture
async def make_ephemeral(
    database_url: str, redis_url: str, channel_prefix: str
) -> AsyncIterator[MakeCluster]:
    started: list[Worker] = []

    async def make(names: list[str], typing: str, presence: str, **fields: Any) -> dict[str, Worker]:
        ports = {name: free_port() for name in names}
        instance_map = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        instance_map.update(fields.pop("instance_map", {}))
        workers = {}
        for name in names:
            config = WorkerConfig(
                instance_name=name,
                database_url=database_url,
                redis_url=redis_url,
                channel_prefix=channel_prefix,
                stream_writers={"events": [names[0]], "typing": [typing], "presence": [presence]},
                http_port=ports[name],
                position_announce_interval_s=0.2,
                instance_map=instance_map,
                worker_secret=fields.get("worker_secret", SECRET),
                **{k: v for k, v in fields.items() if k != "worker_secret"},
            )
            worker = Worker(config)
            started.append(worker)
            await worker.start()
            workers[name] = worker
        return workers

    yield make
    for worker in reversed(started):
        await worker.stop()


async def eventually(check: Callable[[], Any], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_typing_set_on_one_worker_is_seen_on_another_and_expires(make_ephemeral: MakeCluster) -> None:
    w = await make_ephemeral(["p1", "a", "b"], typing="p1", presence="p1")
    await w["a"].ephemeral.typing.set_typing("!r:x", "@u:x", True, 400)
    await eventually(lambda: "!r:x" in w["b"].ephemeral.typing.typing_section(["!r:x", "!s:x"]))
    section = w["b"].ephemeral.typing.typing_section(["!r:x", "!s:x"])
    assert section == {"!r:x": {"type": "m.typing", "content": {"user_ids": ["@u:x"]}}}
    token = w["b"].ephemeral.typing.current_token()
    assert token <= w["p1"].ephemeral.typing.current_token()
    # The writer's timer ends it; the reader hears it and an incremental sync says so.
    await eventually(lambda: w["b"].ephemeral.typing.typing_section(["!r:x"]) == {})
    assert w["b"].ephemeral.typing.typing_section(["!r:x"], since=token) == {
        "!r:x": {"type": "m.typing", "content": {"user_ids": []}}
    }
    assert w["a"].ephemeral.requests.metrics.requests.labels("typing", "ok")._value.get() == 1


async def test_presence_set_and_get_are_forwarded_to_the_writer(make_ephemeral: MakeCluster) -> None:
    w = await make_ephemeral(["p1", "a"], typing="p1", presence="p1")
    await w["a"].ephemeral.presence.set_presence("@u:x", "unavailable", "lunch")
    content = await w["a"].ephemeral.presence.get_presence("@u:x")
    assert content["presence"] == "unavailable" and content["status_msg"] == "lunch"
    await eventually(lambda: w["a"].ephemeral.presence.view.get("@u:x") is not None)
    with pytest.raises(ForwardRefused) as refused:
        await w["a"].ephemeral.requests.request(
            "p1",
            "presence_set",
            "PUT",
            "/_fanout/internal/presence/@u:x",
            body={"presence": "asleep"},
            idempotent=True,
        )
    assert refused.value.status == 400


async def test_requests_without_or_with_a_wrong_secret_are_refused_and_logged(
    make_ephemeral: MakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    w = await make_ephemeral(["p1"], typing="p1", presence="p1")
    url = f"http://127.0.0.1:{w['p1'].http_port}/_fanout/internal/typing/!r:x/@u:x"
    body = {"typing": True, "timeout": 1000}
    caplog.set_level(logging.WARNING, logger="workers.http.internal")
    async with aiohttp.ClientSession() as session:
        async with session.put(url, json=body) as resp:
            assert resp.status == 401
        async with session.put(url, json=body, headers={"Authorization": "Bearer wrong-secret"}) as resp:
            assert resp.status == 403
        async with session.put(url, json=body, headers={"Authorization": f"Bearer {SECRET}"}) as resp:
            assert resp.status == 200
    assert w["p1"].ephemeral.typing.typing_section(["!r:x"]) != {}
    refused = w["p1"].ephemeral.internal.refused
    assert refused.labels("missing_secret")._value.get() == 1
    assert refused.labels("wrong_secret")._value.get() == 1
    assert any("internal request refused: reason=missing_secret" in r.getMessage() for r in caplog.records)
    assert any("internal request refused: reason=wrong_secret" in r.getMessage() for r in caplog.records)


async def test_a_forwarded_write_while_its_owner_is_down_gets_a_clear_error(
    make_ephemeral: MakeCluster,
) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    w = await make_ephemeral(
        ["a"], typing="gone", presence="gone", instance_map={"gone": down}, worker_request_timeout_s=1.0
    )
    started = time.monotonic()
    with pytest.raises(OwnerUnavailable) as error:
        await w["a"].ephemeral.typing.set_typing("!r:x", "@u:x", True, 1000)
    assert time.monotonic() - started < 2.0
    assert error.value.owner == "gone" and "cannot connect" in error.value.reason
    assert error.value.retry_after_s > 0
    metrics = w["a"].ephemeral.requests.metrics
    assert metrics.requests.labels("typing", "unavailable")._value.get() == 1
    assert metrics.retries.labels("typing")._value.get() >= 1


async def test_a_different_secret_on_the_owner_is_a_refusal_not_an_outage(
    make_ephemeral: MakeCluster,
) -> None:
    w = await make_ephemeral(["p1"], typing="p1", presence="p1")
    other = await make_ephemeral(
        ["a"],
        typing="p1",
        presence="p1",
        worker_secret="another-secret-value",
        instance_map={"p1": f"http://127.0.0.1:{w['p1'].http_port}"},
    )
    with pytest.raises(ForwardRefused) as refused:
        await other["a"].ephemeral.presence.set_presence("@u:x", "online", None)
    assert refused.value.status == 403


async def test_ids_the_stream_would_refuse_are_refused_at_the_edge(make_ephemeral: MakeCluster) -> None:
    w = await make_ephemeral(["p1", "a"], typing="p1", presence="p1")
    with pytest.raises(ValueError):
        await w["a"].ephemeral.typing.set_typing("not a room", "@u:x", True, 1000)
    url = f"http://127.0.0.1:{w['p1'].http_port}/_fanout/internal/typing/bad%20room/@u:x"
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {SECRET}"}
        async with session.put(url, json={"typing": True, "timeout": 5}, headers=headers) as resp:
            assert resp.status == 400
        headers["X-Fanout-Positions"] = "events=oops"
        async with session.put(
            url.replace("bad%20room", "!r:x"), json={"typing": True}, headers=headers
        ) as resp:
            assert resp.status == 400
    assert w["p1"].ephemeral.typing.typing_section(["!r:x"]) == {}


async def test_the_owner_waits_for_the_callers_positions_within_a_bound(make_ephemeral: MakeCluster) -> None:
    w = await make_ephemeral(["p1", "a"], typing="p1", presence="p1")
    seen = w["a"].ephemeral.positions()
    assert seen[("events", "p1")] == w["p1"].ephemeral.positions()[("events", "p1")]
    assert await w["p1"].ephemeral.wait_for_positions(seen, 0.5)
    ahead = {("events", "p1"): seen[("events", "p1")] + 1000, ("no_such_stream", "x"): 5}
    started = time.monotonic()
    assert not await w["p1"].ephemeral.wait_for_positions(ahead, 0.3)
    assert 0.3 <= time.monotonic() - started < 1.0


async def test_a_restarted_presence_writer_hears_the_current_syncers_again(
    make_ephemeral: MakeCluster,
) -> None:
    w = await make_ephemeral(["p1", "a"], typing="p1", presence="p1")
    async with w["a"].ephemeral.sync_tracker.sync_request("@s:x", "D"):
        await eventually(lambda: w["p1"].ephemeral.presence.tracker.syncing("@s:x"))
        config = w["p1"].config
        await w["p1"].stop()  # its in-memory presence is gone with it
        again = Worker(config)
        try:
            await again.start()
            # Its stream resets on "a", which re-sends the start (the keep-alive is a minute away).
            await eventually(lambda: again.ephemeral.presence.tracker.syncing("@s:x"))
            assert again.ephemeral.presence.tracker.get("@s:x").presence == "online"
        finally:
            await again.stop()


async def test_current_syncers_are_sent_again_after_a_reconnection(
    make_ephemeral: MakeCluster, redis_url: str, channel_prefix: str
) -> None:
    w = await make_ephemeral(["p1", "a"], typing="p1", presence="p1")
    admin = aioredis.Redis.from_url(redis_url)
    listener = aioredis.Redis.from_url(redis_url)
    pubsub = listener.pubsub()
    try:
        workers_subscribers = [c["id"] for c in await admin.client_list(_type="pubsub")]
        await pubsub.subscribe(channel_prefix)
        async with w["a"].ephemeral.sync_tracker.sync_request("@s:x", "D"):
            wanted = f"USER_SYNC {w['a'].ephemeral.instance_id} @s:x D start ".encode()
            assert await _next_with(pubsub, wanted, 5.0)  # the first sync
            await _next_with(pubsub, b"never", 1.5)  # past the re-send of the start-up's presence reset
            for client_id in workers_subscribers:  # cut the workers' subscriptions (not ours)
                await admin.client_kill_filter(_id=client_id)
            # Sent again once the subscription is back, long before the one-minute keep-alive.
            assert await _next_with(pubsub, wanted, 5.0)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await listener.aclose()
        await admin.aclose()


async def _next_with(pubsub: Any, wanted: bytes, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
        if message is not None and message["data"].startswith(wanted):
            return True
    return False
