"""The stored streams (account data, device lists, to-device, room versions) with real worker
processes: two writers of each stream under load, one SIGKILLed and restarted, a reader whose Redis
link is cut (it misses RDATA and catches up from the database), and the regressions that only
multi-writer replication shows."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable

import aiohttp
import redis.asyncio as aioredis

from tests.cluster.conftest import MakeCluster
from tests.cluster.test_ephemeral import eventually
from tests.cluster.test_scenarios import proxies
from workers.harness.cluster_client import ClusterClient
from workers.harness.faultproxy import FaultProxy, through
from workers.harness.loadgen import LoadDriver, LoadPlan
from workers.routing import writer_for_user
from workers.storage import Conn, connect
from workers.streams import account_data, device_lists, to_device

__all__ = ["proxies"]  # the fault-proxy fixture, shared with the fault scenarios

STREAM_TABLES = {
    account_data.ACCOUNT_DATA: account_data.TABLES,
    device_lists.DEVICE_LISTS: device_lists.TABLES,
    to_device.TO_DEVICE: to_device.TABLES,
}
C = "/_matrix/client/v3"


async def test_two_writers_a_sigkill_and_a_cut_reader_lose_nothing_and_reuse_no_id(
    make_cluster: MakeCluster,
    database_url: str,
    redis_url: str,
    proxies: Callable[[str], Awaitable[FaultProxy]],
) -> None:
    proxy = await proxies(redis_url)
    cluster = await make_cluster(
        background_workers=0, worker_config={"sync2": {"redis_url": through(redis_url, proxy)}}
    )
    plan = LoadPlan(users=8, rooms=4, rooms_per_user=2, actions=700, concurrency=6, sync_timeout_ms=500)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        driver = LoadDriver(
            session, cluster.urls, cluster.event_writers, cluster.sync_workers, database_url, plan
        )
        await driver.setup()
        load = asyncio.create_task(driver.run())
        await eventually(lambda: _sent(driver, 40), within_s=60)
        proxy.cut()  # sync2 hears nothing: every RDATA published meanwhile is lost to it
        cluster.kill("persister2")  # a writer of every stream, mid-write
        async with connect(database_url) as conn:
            top_at_kill = {s: await _max_id(conn, s) for s in STREAM_TABLES}
        await asyncio.sleep(1.0)
        await cluster.start(["persister2"])
        proxy.restore()
        report = await load
        # Write through the restarted writer too: a user whose streams hash to it (the load's
        # eight users may all hash to persister1, 1 run in 256, so one of its own).
        client = ClusterClient(session, cluster.urls, cluster.event_writers)
        await client.register(_name_on("persister2", cluster.event_writers), via="sync1")
        await client.put_account_data("io.test.after", {"after": "restart"}, via="sync2")
        await client.send_to_device(
            "io.test.after", {str(driver.clients[0].user_id): {"*": {"msg": "after"}}}
        )
        await client.upload_keys({"keys": {f"ed25519:{client.device_id}": "after"}}, via="sync1")
    assert report.problems == [], report.problems[:10]
    assert report.account_data_sent and report.to_device_sent and report.device_changes_sent
    assert report.account_data_seen and report.to_device_seen and report.device_changes_seen
    async with connect(database_url) as conn:
        for stream, tables in STREAM_TABLES.items():
            ids = await conn.fetch(_union(tables, "stream_id, instance_name"))
            per_id: dict[int, set[str]] = {}
            for r in ids:
                per_id.setdefault(r["stream_id"], set()).add(r["instance_name"])
            # An id is one write, by one writer (the rows of one device-list or to-device write
            # share it; the crash and restart handed none out twice).
            assert ids and all(len(writers) == 1 for writers in per_id.values()), stream
        # Nothing the restarted writer wrote took an id handed out before the kill.
        restarted = await conn.fetchval(
            "SELECT min(stream_id) FROM account_data WHERE account_data_type = 'io.test.after'"
        )
        assert restarted > top_at_kill[account_data.ACCOUNT_DATA]
        changes = await conn.fetchval(
            "SELECT max(stream_id) FROM device_lists_stream WHERE user_id = $1", client.user_id
        )
        assert changes > top_at_kill[device_lists.DEVICE_LISTS]


async def test_device_list_rows_are_one_entity_each_and_pokes_are_consumed(
    make_cluster: MakeCluster, database_url: str, redis_url: str, channel_prefix: str
) -> None:
    cluster = await make_cluster(background_workers=1)
    inspect = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers.cli", "inspect", "--redis-url", redis_url, "--prefix", channel_prefix,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert inspect.stderr is not None
    assert b"listening on" in await asyncio.wait_for(inspect.stderr.readline(), 30)  # subscribed
    raw = aioredis.Redis.from_url(redis_url)
    pubsub = raw.pubsub()
    await pubsub.subscribe(channel_prefix)
    try:
        async with aiohttp.ClientSession() as session:
            alice, bob = ClusterClient(session, cluster.urls), ClusterClient(session, cluster.urls)
            await alice.register("alice", via="sync1")
            await bob.register("bob", via="sync2")
            room = await alice.create_room("public")
            await bob.membership(room, "join")
            # Two remote servers' users in the room (what federation joins would have stored).
            async with connect(database_url) as conn:
                await conn.execute(
                    "INSERT INTO current_state_events (room_id, type, state_key, event_id, membership,"
                    " event_stream_ordering) SELECT $1, 'm.room.member', u, '$fed' || u, 'join', 1"
                    " FROM unnest($2::text[]) AS u",
                    room,
                    ["@x:one.test", "@y:two.test", "@z:two.test"],
                )
            await bob.upload_keys({"keys": {f"ed25519:{bob.device_id}": "k"}})
            await alice.put_account_data("io.test.one", {"n": 1})
            await bob.send_to_device("io.test", {str(alice.user_id): {"*": {"msg": "hi"}}})
            entities: list[str] = []

            async def device_rows() -> bool:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
                if message is not None and message["data"].startswith(b"RDATA device_lists "):
                    line = message["data"].decode()
                    row = json.loads(line.split(" ", 4)[4])
                    # One entity per row: ["entity"] in a batch, [prev, n, "entity"] numbered.
                    assert len(row) in (1, 3) and isinstance(row[-1], str), line
                    entities.append(row[-1])
                return {"one.test", "two.test"} <= set(entities)

            await eventually(device_rows, within_s=20)
            # The logins (alice, bob), bob's keys, and one row per server sharing a room with bob.
            assert set(entities) == {"@alice:localhost", "@bob:localhost", "one.test", "two.test"}
            assert entities.count("one.test") == entities.count("two.test") == 1

            # The stand-in federation sender (background1) consumes the pokes.
            async def consumed() -> bool:
                async with connect(database_url) as conn:
                    left = await conn.fetchval("SELECT count(*) FROM device_lists_outbound_pokes")
                    sent = await conn.fetch("SELECT destination, user_id FROM device_lists_outbound_sent")
                return left == 0 and {(r["destination"], r["user_id"]) for r in sent} >= {
                    ("one.test", "@bob:localhost"),
                    ("two.test", "@bob:localhost"),
                }

            await eventually(consumed, within_s=20)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await raw.aclose()
        inspect.terminate()
        out = (await inspect.communicate())[0].decode()
    # The inspection tool names each stream and its rows' fields.
    for stream, field in (("account_data", 'data_type="io.test.one"'), ("device_lists", 'entity="two.test"'),
                          ("to_device", 'entity="@alice:localhost"')):  # fmt: skip
        assert any(f"RDATA stream={stream} " in line and field in line for line in out.splitlines()), out


async def test_to_device_writers_share_no_row(make_cluster: MakeCluster, database_url: str) -> None:
    """Synapse kept a "max stream id" row that every to-device writer updated in its transaction,
    so two writers' sends conflicted. Two writers sending at once here only insert."""
    cluster = await make_cluster(background_workers=0, sync_workers=1)
    async with aiohttp.ClientSession() as session:
        clients = [ClusterClient(session, cluster.urls) for _ in range(6)]
        for n, client in enumerate(clients):
            await client.register(f"user{n}", via="sync1")
        owners = {_owner(c, cluster.event_writers) for c in clients}
        assert owners == set(cluster.event_writers)  # both writers take sends
        async with connect(database_url) as conn:
            before = await _writes(conn)
        await asyncio.gather(
            *(
                c.send_to_device(
                    "io.test", {str(o.user_id): {"*": {"msg": f"{n}"}} for o in clients if o is not c}
                )
                for n, c in enumerate(clients)
                for _ in range(5)
            )
        )
        async with connect(database_url) as conn:
            inserted = await conn.fetchval("SELECT count(*) FROM device_inbox")

        async def flushed() -> dict[str, tuple[int, int]] | None:
            # Backends report table statistics when idle, up to ~10 s late: wait for the inserts.
            async with connect(database_url) as conn:
                after = await _writes(conn)
            grown = after["device_inbox"][0] - before["device_inbox"][0]
            return after if grown >= inserted else None

        after = await eventually(flushed, within_s=30)
    assert inserted == 6 * 5 * 5
    assert {t: upd for t, (_ins, upd) in after.items()} == {t: upd for t, (_ins, upd) in before.items()}


async def test_room_versions_survive_a_reader_restart(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(background_workers=0, extra_config={"default_room_version": "11"})
    async with aiohttp.ClientSession() as session:
        alice = ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        v10, v11 = await alice.create_room(room_version="10"), await alice.create_room()
        redactions = {}
        for room in (v10, v11):
            sent = await alice.send(room, "m.room.message", {"body": "x"}, via="sync1")
            url = f"{cluster.url('sync1')}{C}/rooms/{room}/redact/{sent['event_id']}/t"
            redactions[room] = (await alice._call("PUT", url, {}))["event_id"]
        peer = ClusterClient(session, cluster.urls, token=cluster.worker_secret)
        invite = {"room_version": "11", "event": {"type": "m.room.member", "sender": "@z:far.test",
                  "state_key": "@alice:localhost", "content": {"membership": "invite"}}}  # fmt: skip
        await peer._call(
            "PUT", f"{cluster.url('sync2')}/_matrix/federation/v2/invite/!far:far.test/$i1", invite
        )
        cluster.kill("sync1")  # forgets every version it learned from replication
        await cluster.start(["sync1"])
        for room, inside in ((v10, False), (v11, True)):
            event = await alice._call(
                "GET", f"{cluster.url('sync1')}{C}/rooms/{room}/event/{redactions[room]}"
            )
            assert ("redacts" in event["content"]) is inside and event["redacts"]
        initial = await alice.sync("sync1")
        assert "!far:far.test" in initial["rooms"]["invite"]
        await alice.membership("!far:far.test", "join", via="sync1")


def _owner(client: ClusterClient, writers: list[str]) -> str:
    return writer_for_user(str(client.user_id), writers, "to_device")


def _name_on(writer: str, writers: list[str]) -> str:
    """A user name whose stored streams' writes hash to `writer`."""
    streams = (account_data.ACCOUNT_DATA, device_lists.DEVICE_LISTS, to_device.TO_DEVICE)
    return next(
        name
        for i in range(500)
        if all(writer_for_user(f"@{(name := f'after{i}')}:localhost", writers, s) == writer for s in streams)
    )


def _sent(driver: LoadDriver, count: int) -> Awaitable[bool]:
    async def check() -> bool:
        report = driver.report
        return min(report.account_data_sent, report.to_device_sent, report.device_changes_sent) * 3 >= count

    return check()


def _union(tables: list[tuple[str, str, str]], columns: str) -> str:
    return " UNION ALL ".join(f"SELECT {columns.format(table=t)} FROM {t}" for t, _i, _s in tables)


async def _max_id(conn: Conn, stream: str) -> int:
    value = await conn.fetchval(
        f"SELECT coalesce(max(stream_id), 0) FROM ({_union(STREAM_TABLES[stream], 'stream_id')}) t"
    )
    return int(value)


async def _writes(conn: Conn) -> dict[str, tuple[int, int]]:
    """(rows inserted, rows updated) of each to-device table, from PostgreSQL's statistics."""
    tables = [t for t, _i, _s in STREAM_TABLES[to_device.TO_DEVICE]] + ["device_inbox_txns"]
    records = await conn.fetch(
        "SELECT relname, n_tup_ins, n_tup_upd FROM pg_stat_user_tables WHERE relname = ANY($1::text[])",
        tables,
    )
    return {r["relname"]: (r["n_tup_ins"], r["n_tup_upd"]) for r in records}
