"""`fanout inspect`: live decoding (rejections shown as such) and the positions table."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from pubsub import keys
from tests.conftest import RedisTarget, on_redis_cluster
from tests.pubsub.conftest import STREAM, NodeFactory
from workers.cli.redis_inspect import describe, main


def test_describe_decodes_and_flags_rejections() -> None:
    assert describe(b"POSITION s w1 3 7") == "POSITION stream=s instance=w1 prev_token=3 new_token=7"
    assert describe(b"RDATA s w1 batch {}").startswith("RDATA stream=s instance=w1 token=batch {}")
    assert describe(b"BOGUS").startswith("REJECTED unknown_command")


def test_describe_names_the_fields_of_every_streams_rows() -> None:
    assert describe(b'RDATA device_lists p1 7 [5,2,"@bob:hs"]') == (
        'RDATA stream=device_lists instance=p1 token=7 prev=5 rows=2 entity="@bob:hs"'
    )
    assert describe(b'RDATA to_device p2 batch ["remote.test"]') == (
        'RDATA stream=to_device instance=p2 token=batch entity="remote.test"'
    )
    assert describe(b'RDATA account_data p1 9 [8,1,"@a:hs",null,"m.tag"]').endswith(
        'user_id="@a:hs" room_id=null data_type="m.tag"'
    )
    assert describe(b'RDATA receipts p1 4 [3,1,"!r:hs","m.read","@a:hs","$e",null,{"ts":1}]').endswith(
        'room_id="!r:hs" receipt_type="m.read" user_id="@a:hs" event_id="$e" thread_id=null data={"ts": 1}'
    )
    assert describe(b"RDATA account_data p1 9 [1,2]").endswith("[1,2]")  # not its shape: as it came


async def _written_and_hinted(make_node: NodeFactory, target: RedisTarget, channel_prefix: str) -> int:
    """A writer w1 writes three rows; returns its position once the positions hash shows it."""
    writer = await make_node("w1", target=target, announce_interval_s=0.1)
    await writer.write(3)
    token: int = writer.generator.get_current_token_for_writer("w1")
    hints = target.client()
    try:
        for _ in range(300):
            if await hints.hget(keys.positions_key(channel_prefix, STREAM), "w1") == str(token).encode():
                break
            await asyncio.sleep(0.01)
    finally:
        await hints.aclose()
    return token


async def test_positions_lists_every_writer(
    make_node: NodeFactory, redis_url: str, channel_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    token = await _written_and_hinted(make_node, RedisTarget(redis_url), channel_prefix)
    rc = await asyncio.to_thread(main, ["--redis-url", redis_url, "--prefix", channel_prefix, "--positions"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"{{w1={token}}}" in out
    assert "w1" in out.split("heartbeats")[1]


async def test_live_mode_prints_decoded_commands(
    redis_url: str, channel_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    task = asyncio.create_task(
        asyncio.to_thread(main, ["--redis-url", redis_url, "--prefix", channel_prefix, "--count", "2"])
    )
    raw = aioredis.Redis.from_url(redis_url)
    try:

        async def subscribed() -> bool:
            counts = await raw.pubsub_numsub(channel_prefix)
            return bool(counts and counts[0][1] > 0)

        for _ in range(500):
            if await subscribed():
                break
            await asyncio.sleep(0.01)
        await raw.publish(channel_prefix, b"POSITION s w1 1 2")
        await raw.publish(channel_prefix, b"NONSENSE here")
        assert await asyncio.wait_for(task, 10) == 0
    finally:
        await raw.aclose()
    out = capsys.readouterr().out
    assert "POSITION stream=s instance=w1 prev_token=1 new_token=2" in out
    assert "REJECTED unknown_command" in out


@on_redis_cluster
async def test_positions_and_live_mode_on_a_redis_cluster(
    make_node: NodeFactory,
    redis_cluster_urls: tuple[str, ...],
    channel_prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = RedisTarget(redis_cluster_urls[0], redis_cluster_urls)
    cluster = ["--redis-cluster", ",".join(redis_cluster_urls), "--prefix", channel_prefix]
    token = await _written_and_hinted(make_node, target, channel_prefix)
    assert await asyncio.to_thread(main, [*cluster, "--positions"]) == 0
    assert f"{{w1={token}}}" in capsys.readouterr().out
    live = asyncio.create_task(asyncio.to_thread(main, [*cluster, "--sharded", "--count", "1"]))
    for _ in range(200):  # until the inspector, subscribed on the base channel's shard, hears one
        await target.publish(keys.base_channel(channel_prefix), [b"POSITION s w1 1 2"])
        if live.done():
            break
        await asyncio.sleep(0.05)
    assert await asyncio.wait_for(live, 10) == 0
    assert "POSITION stream=s instance=w1 prev_token=1 new_token=2" in capsys.readouterr().out
