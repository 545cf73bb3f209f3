"""Replication end to end with real Redis and Postgres: catch-up, message loss, forged input."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from pubsub import keys
from pubsub.redis_transport import RedisTransport
from tests.conftest import RedisTarget, both_backends
from tests.pubsub.conftest import STREAM, NodeFactory, check_history, wait_for

GOOD = b'[0, 1, "w1", 1, "x"]'


@both_backends
async def test_late_subscriber_gets_no_rdata_and_catches_up_from_the_database(make_node: NodeFactory) -> None:
    reader = await make_node(
        "r1", start=False, catch_up_batch_size=100
    )  # generator loaded before the writes: it must catch up
    writer = await make_node("w1")
    for _ in range(10):
        await writer.write_many(100)
    await wait_for(lambda: writer.client.publisher.positions()[STREAM] >= 1000, what="writer flushed")
    await reader.client.start()
    await wait_for(lambda: reader.applied_count() == 1000, what="catch-up of 1000 rows")
    check_history(reader.applied, {"w1": writer.written})
    assert reader.metric("fanout_repl_commands_in_total", command="RDATA", stream=STREAM) == 0
    assert reader.metric("fanout_repl_catch_up_rows_total", stream=STREAM) == 1000
    assert reader.metric("fanout_repl_catch_up_fetches_total", stream=STREAM) >= 1
    assert reader.client.read_streams[STREAM].current_token(
        "w1"
    ) == writer.generator.get_current_token_for_writer("w1")


@both_backends
async def test_every_third_message_dropped_still_exactly_once_in_order(make_node: NodeFactory) -> None:
    def every_third(n: int) -> bool:
        return n % 3 == 2

    reader = await make_node("r1", writers=["w1", "w2"], catch_up_batch_size=7)
    w1 = await make_node("w1", writers=["w1", "w2"], drop_filter=every_third)
    w2 = await make_node("w2", writers=["w1", "w2"], drop_filter=every_third)
    await wait_for(lambda: reader.client.handler.is_connected(STREAM, "w1"), what="w1 connected")

    async def load(node: object, rows_per_token: int) -> None:
        assert hasattr(node, "write")
        for _ in range(20):
            await node.write(5, rows_per_token=rows_per_token)
            await asyncio.sleep(0.005)

    await asyncio.gather(load(w1, 1), load(w2, 3))
    took = await wait_for(
        lambda: reader.applied_count() == len(w1.written) + len(w2.written), what="every row despite drops"
    )
    check_history(reader.applied, {"w1": w1.written, "w2": w2.written})
    assert w1.metric("fanout_repl_dropped_total", reason="test_hook") > 0
    assert reader.metric("fanout_repl_catch_up_rows_total", stream=STREAM) > 0
    print(f"converged {took:.3f}s after the last write (announce interval 0.2s)")


@both_backends
async def test_forged_and_malformed_lines_are_rejected_and_counted(
    make_node: NodeFactory, redis_target: RedisTarget, channel_prefix: str
) -> None:
    reader = await make_node("r1", writers=["w1"], max_line_bytes=2048)
    writer = await make_node("w1", writers=["w1"])
    await writer.write(3)
    await wait_for(lambda: reader.applied_count() == 3, what="first rows")
    position = reader.client.read_streams[STREAM].current_token("w1")
    forged: list[bytes] = [
        b"",
        b"HELLO",
        b"replicate",
        b"REPLICATE please",
        b"POSITION test_rows w1 1",
        b"POSITION test_rows w1 -1 5",
        b"POSITION test_rows w1 9 5",
        b"POSITION test_rows w1 1 0x10",
        b"POSITION test_rows intruder 0 999999",
        b"POSITION test/rows w1 0 5",
        b"RDATA test_rows intruder 999999 " + GOOD,
        b"RDATA test_rows w1 999999 not-json",
        b'RDATA test_rows w1 999999 [0, 1, "w1"]',
        b'RDATA test_rows w1 999999 [0, 1, "w1", "one", "x"]',
        b'RDATA test_rows w1 999999 [0, 1, "w1", "1", "x"]',
        b'RDATA test_rows w1 999999 {"prev": 0, "n": 1, "row": {"writer": "w1", "seq": 1, "payload": "x"}}',
        b"RDATA test_rows w1 999999 " + GOOD.replace(b"[0,", b"[-3,"),
        b"RDATA test_rows w1 batch " + GOOD,
        b"RDATA test_rows w1 999999 " + GOOD[:-1],
        b"RDATA test_rows w1 999999",
        b"RDATA test_rows w1 -5 " + GOOD,
        b'RDATA test_rows w1 999999 [0, 1, "w1", 1, "' + b"x" * 4000 + b'"]',
        b"RDATA test_rows w1 999999 [0,\n1]",
        b"\xff\xfeRDATA",
        b"USER_SYNC abcde @u:x dev maybe 5",
        b"USER_SYNC abcde @u:x dev start",
        b"CLEAR_USER_SYNC",
        b"\x00\x01\x02",
    ]
    for line in forged:
        before = reader.metric("fanout_repl_rejected_total")
        await redis_target.publish(keys.base_channel(channel_prefix), [line])
        await wait_for(
            lambda b=before: reader.metric("fanout_repl_rejected_total") == b + 1,
            what=f"rejection of {line[:60]!r}",
        )
    assert len(forged) >= 20
    # A stream this release does not know is a newer release's: skipped and counted, not rejected.
    rejected = reader.metric("fanout_repl_rejected_total")
    await redis_target.publish(
        keys.base_channel(channel_prefix), [b"POSITION nosuch w1 0 5", b"RDATA nosuch w1 999999 " + GOOD]
    )
    await wait_for(
        lambda: reader.metric("fanout_repl_dropped_total", reason="unknown_stream") == 2,
        what="unknown stream skipped",
    )
    assert reader.metric("fanout_repl_rejected_total") == rejected
    assert reader.client.read_streams[STREAM].current_token("w1") == position
    reasons = {
        s.labels["reason"]
        for metric in reader.client.metrics.registry.collect()
        if metric.name == "fanout_repl_rejected"
        for s in metric.samples
        if s.name.endswith("_total")
    }
    assert {
        "not_a_writer",
        "invalid_row",
        "too_long",
        "bad_token",
        "unknown_command",
    } <= reasons
    await writer.write(2)  # the handler still works, and the batch gap was healed by a POSITION
    await wait_for(lambda: reader.applied_count() == 5, what="rows after the forgeries")
    check_history(reader.applied, {"w1": writer.written})


@pytest.mark.parametrize(("per_stream", "sharded"), [(True, False), (False, True), (True, True)])
async def test_channel_options_deliver_live_rows(
    make_node: NodeFactory, per_stream: bool, sharded: bool
) -> None:
    options = {"per_stream_channels": per_stream, "sharded_pubsub": sharded}
    reader = await make_node("r1", **options)
    writer = await make_node("w1", **options)
    await wait_for(lambda: reader.client.handler.is_connected(STREAM, "w1"), what="connected")
    await writer.write(20, rows_per_token=2)
    await wait_for(lambda: reader.applied_count() == 40, what="live rows")
    check_history(reader.applied, {"w1": writer.written})
    assert reader.metric("fanout_repl_commands_in_total", command="RDATA", stream=STREAM) > 0
    if per_stream:
        assert reader.client.channels() == [
            keys.base_channel(reader.client.settings.channel_prefix),
            keys.stream_channel(reader.client.settings.channel_prefix, STREAM, True),
        ]


@both_backends
async def test_positions_hash_heartbeat_and_silent_writers(
    make_node: NodeFactory, redis_target: RedisTarget, channel_prefix: str
) -> None:
    reader = await make_node("r1", writers=["w1", "w2"], announce_interval_s=0.1, silent_writer_intervals=3)
    writer = await make_node("w1", writers=["w1", "w2"], announce_interval_s=0.1, silent_writer_intervals=3)
    await writer.write(4)
    raw = redis_target.client()
    try:
        token = writer.generator.get_current_token_for_writer("w1")
        await wait_for(lambda: reader.applied_count() == 4, what="rows")

        async def hint() -> dict[bytes, bytes]:
            return await raw.hgetall(keys.positions_key(channel_prefix, STREAM))  # type: ignore[no-any-return]

        for _ in range(200):
            if (await hint()).get(b"w1") == str(token).encode():
                break
            await asyncio.sleep(0.01)
        assert (await hint())[b"w1"] == str(token).encode()
        ttl = await raw.pttl(keys.heartbeat_key(channel_prefix, "w1"))
        assert 0 < ttl <= 300
        await wait_for(lambda: not reader.client.health()["ok"], what="w2 reported silent")
        health = reader.client.health()
        assert [(s["stream"], s["instance"]) for s in health["silent_writers"]] == [(STREAM, "w2")]
        assert health["streams"][STREAM]["w1"]["position"] == token
        assert reader.metric("fanout_repl_writer_silent", stream=STREAM, writer="w2") == 1
        assert reader.metric("fanout_repl_writer_silent", stream=STREAM, writer="w1") == 0
    finally:
        await raw.aclose()


@both_backends
async def test_user_sync_commands_are_routed(make_node: NodeFactory) -> None:
    from pubsub.wire import ClearUserSync, UserSync

    reader = await make_node("r1")
    sender = await make_node("w1")
    seen: list[object] = []
    reader.client.add_user_sync_listener(seen.append)
    await sender.client.send(UserSync("abcde", "@alice:example.org", "DEV1", "start", 1234))
    await sender.client.send(ClearUserSync("abcde"))
    await wait_for(lambda: len(seen) == 2, what="user sync commands")
    assert seen == [UserSync("abcde", "@alice:example.org", "DEV1", "start", 1234), ClearUserSync("abcde")]


async def test_receive_fast_path_takes_buffered_replies_from_hiredis(make_node: NodeFactory) -> None:
    """The read loop drains replies hiredis already parsed; if a redis-py upgrade moves its parser
    internals this fails (the loop would silently fall back to one `parse_response` per message)."""
    from pubsub.redis_transport import _buffered_replies

    reader = await make_node("r1")
    writer = await make_node("w1")
    pubsub = reader.client.transport._pubsub
    assert pubsub is not None
    assert _buffered_replies(pubsub.connection) is not None
    await writer.write_many(500)
    await wait_for(lambda: reader.applied_count() == 500, what="every row through the fast path")
    check_history(reader.applied, {"w1": writer.written})


async def test_a_write_whose_commit_is_unknown_is_fetched_by_readers(make_node: NodeFactory) -> None:
    """A writer whose connection broke at COMMIT cannot tell whether its rows exist: it stages the
    token as unknown, and readers fetch it from the database. Here the row exists (committed), the
    rows after it are published as usual, and the reader gets all of them in order."""
    reader = await make_node("r1")
    writer = await make_node("w1")
    await writer.write(2)
    async with writer.generator.get_next() as token:
        writer.seq += 1
        await writer.pool.execute(
            "INSERT INTO test_rows (stream_id, instance_name, seq, payload) VALUES ($1, 'w1', $2, 'x')",
            token,
            writer.seq,
        )
        writer.written.append(writer.seq)
        writer.client.stage_unknown(STREAM, token)  # no RDATA for it: only the database knows
    writer.client.notify(STREAM)
    await writer.write(2)
    await wait_for(lambda: reader.applied_count() == 5, what="the unknown row fetched, the rest published")
    check_history(reader.applied, {"w1": writer.written})
    assert reader.metric("fanout_repl_catch_up_rows_total", stream=STREAM) >= 1


async def test_publishes_ask_for_no_replies_and_survive_their_link_being_killed(
    make_node: NodeFactory, redis_url: str
) -> None:
    """On one server the writer's publishes go out after `CLIENT REPLY OFF`: nothing comes back
    to read on their link. When the server drops that link, the next publish reconnects and asks
    again, and every row still reaches the reader in order."""
    reader = await make_node("r1")
    writer = await make_node("w1")
    transport = writer.client.transport
    assert isinstance(transport, RedisTransport) and transport._quiet is not None
    admin = aioredis.Redis.from_url(redis_url)

    async def quiet_link() -> str:
        """The address Redis knows the writer's publishing link by; once it has sat for a while,
        nothing came back on it."""
        link = transport._quiet
        assert link is not None
        await asyncio.sleep(0.1)
        name = link.socket_name()
        assert name is not None and link.unread() == 0
        return f"{name[0]}:{name[1]}"

    try:
        await writer.write_many(50)
        await wait_for(lambda: reader.applied_count() == 50, what="rows published without replies")
        addr = await quiet_link()
        [cmd] = [c["cmd"] for c in await admin.client_list() if c["addr"] == addr]
        assert cmd in ("publish", "hset", "set")  # its lines, or the hint keys at a tick
        assert await admin.client_kill_filter(addr=addr) == 1
        await writer.write_many(50)
        await wait_for(lambda: reader.applied_count() == 100, what="rows after the link was killed")
        again = await quiet_link()
        assert again != addr
        check_history(reader.applied, {"w1": writer.written})
    finally:
        await admin.aclose()
