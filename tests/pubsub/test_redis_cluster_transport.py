"""The Redis Cluster transport against a real 3-shard cluster: routing, slot migration, failover, MOVED."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from pubsub import keys
from pubsub.redis_cluster_transport import RedisClusterTransport, node_url
from tests.conftest import RedisTarget, on_redis_cluster
from tests.pubsub.conftest import STREAM, NodeFactory, check_history, fault_mid_stream, wait_for
from workers.embedded.redis_cluster import RedisClusterServers
from workers.harness.redis_cluster_faults import Address, migrate_slot, owner_of, wait_for_new_owner

pytestmark = on_redis_cluster


def test_node_url_keeps_scheme_credentials_and_options() -> None:
    seed = "rediss://user:secret@10.0.0.1:7000/0?ssl_ca_certs=/ca.pem"
    assert node_url(seed, "10.0.0.2", 7001) == "rediss://user:secret@10.0.0.2:7001/0?ssl_ca_certs=/ca.pem"
    assert node_url("redis://h:1", "::1", 7002) == "redis://[::1]:7002/0"


async def _shard_channels(address: Address) -> set[bytes]:
    client = aioredis.Redis(host=address[0], port=address[1])
    try:
        return set(await client.execute_command("PUBSUB", "SHARDCHANNELS"))
    finally:
        await client.aclose()


def _cluster(servers: RedisClusterServers) -> RedisTarget:
    return RedisTarget(servers.urls[0], tuple(servers.urls))


async def test_each_channel_is_subscribed_on_the_shard_that_owns_it(
    make_node: NodeFactory, redis_cluster_urls: tuple[str, ...], channel_prefix: str
) -> None:
    target = RedisTarget(redis_cluster_urls[0], redis_cluster_urls)
    reader = await make_node("r1", target=target)
    writer = await make_node("w1", target=target)
    await writer.write(10, rows_per_token=2)
    await wait_for(lambda: reader.applied_count() == 20, what="live rows")
    check_history(reader.applied, {"w1": writer.written})
    assert reader.metric("fanout_repl_commands_in_total", command="RDATA", stream=STREAM) > 0
    for channel in (keys.base_channel(channel_prefix), keys.stream_channel(channel_prefix, STREAM, True)):
        owner, _ = await owner_of(redis_cluster_urls, channel)
        assert channel.encode() in await _shard_channels(owner)


async def test_broadcast_publish_on_a_cluster_delivers(
    make_node: NodeFactory, redis_cluster_urls: tuple[str, ...], channel_prefix: str
) -> None:
    """Without sharded pub/sub the cluster copies each PUBLISH to every node: a reader homed on one
    node hears a writer homed on another. The hint keys still go to their slot's owner."""
    target = RedisTarget(redis_cluster_urls[0], redis_cluster_urls)
    hints_owner, _ = await owner_of(redis_cluster_urls, keys.HINTS_TAG)
    homes = [(n, (await owner_of(redis_cluster_urls, n))[0]) for n in (f"node{i}" for i in range(40))]
    away = [n for n, home in homes if home != hints_owner]  # homed away from the hint keys' node
    r, w = away[0], next(n for n, home in homes if n in away and home != dict(homes)[away[0]])
    options = {"sharded_pubsub": False, "per_stream_channels": True}
    reader = await make_node(r, writers=[w], target=target, **options)
    writer = await make_node(w, writers=[w], target=target, **options)
    await writer.write(10)
    await wait_for(lambda: reader.applied_count() == 10, what="live rows")
    check_history(reader.applied, {w: writer.written})
    hints = target.client()
    try:
        for _ in range(200):
            if await hints.exists(keys.heartbeat_key(channel_prefix, w)):
                break
            await asyncio.sleep(0.01)
        assert await hints.exists(keys.heartbeat_key(channel_prefix, w))
    finally:
        await hints.aclose()


async def test_slot_migration_of_the_streams_channel_loses_nothing(
    make_node: NodeFactory, private_redis_cluster: RedisClusterServers, channel_prefix: str
) -> None:
    """The stream's channel moves to another shard mid-stream: the old owner's `sunsubscribe`
    makes the reader resubscribe on the new one and catch up; the writer (which reads nothing, so
    only its publishes can tell it) gets MOVED and routes its next lines to the new owner."""
    target = _cluster(private_redis_cluster)
    reader = await make_node("r1", target=target, announce_interval_s=0.1)
    writer = await make_node("w1", target=target, read=[], announce_interval_s=0.1)
    channel = keys.stream_channel(channel_prefix, STREAM, True)
    moved: list[Address] = []

    async def migrate() -> None:
        lost_before = reader.metric("fanout_repl_reconnects_total", kind="loop")
        moved.append((await migrate_slot(private_redis_cluster.urls, channel))[1])
        await wait_for(lambda: reader.metric("fanout_repl_reconnects_total", kind="loop") > lost_before,
                       what="the reader noticing the sunsubscribe")  # fmt: skip

    await fault_mid_stream(reader, writer, migrate)
    assert channel.encode() in await _shard_channels(moved[0])
    assert writer.client.metrics.publish_errors >= 1  # the MOVED that sent it to the new owner


async def test_sigkill_of_the_streams_shard_primary_loses_nothing(
    make_node: NodeFactory, private_redis_cluster: RedisClusterServers, channel_prefix: str
) -> None:
    """The primary serving the stream's channel is SIGKILLed mid-stream; its replica takes over
    (the cluster's node timeout, then an election); writes go on meanwhile. The reader loses its
    link, follows the new map and catches up from the database."""
    target = _cluster(private_redis_cluster)
    urls = private_redis_cluster.urls
    reader = await make_node("r1", target=target, announce_interval_s=0.1)
    writer = await make_node("w1", target=target, announce_interval_s=0.1)
    channel = keys.stream_channel(channel_prefix, STREAM, True)
    promoted: list[Address] = []

    async def kill_primary() -> None:
        old, _ = await owner_of(urls, channel)
        connects = reader.client.transport.connects
        private_redis_cluster.kill(private_redis_cluster.node_by_port(old[1]))
        promoted.append(await wait_for_new_owner(urls, channel, old))
        await wait_for(lambda: reader.client.transport.connects > connects, limit_s=30,
                       what="the reader subscribed on the promoted replica")  # fmt: skip

    await fault_mid_stream(reader, writer, kill_primary)
    assert reader.metric("fanout_repl_catch_up_rows_total", stream=STREAM) > 0
    assert channel.encode() in await _shard_channels(promoted[0])


async def test_server_killing_every_subscriber_connection_triggers_resync(
    make_node: NodeFactory, redis_cluster_urls: tuple[str, ...]
) -> None:
    target = RedisTarget(redis_cluster_urls[0], redis_cluster_urls)
    reader = await make_node("r1", target=target)
    writer = await make_node("w1", target=target)
    await writer.write(5)
    await wait_for(lambda: reader.applied_count() == 5, what="first rows")
    for _ in range(3):
        for url in redis_cluster_urls:
            node = aioredis.Redis.from_url(url)
            try:
                await node.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            finally:
                await node.aclose()
        await writer.write(5)
    await wait_for(lambda: reader.applied_count() == len(writer.written), what="every row after kills")
    check_history(reader.applied, {"w1": writer.written})
    transport = reader.client.transport
    assert isinstance(transport, RedisClusterTransport)
    # The rows may all be in (caught up) a moment before the reconnect is counted.
    await wait_for(lambda: transport.connects >= 2, what="the subscriber reconnected")
