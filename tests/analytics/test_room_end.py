"""The audit reports a room's end: a real worker purges a room and empties another, then the audit
of its database counts the rows, the room and each former member as keys, with no gap."""

from __future__ import annotations

import asyncio

import aiohttp
from pyspark.sql import SparkSession

import analytics
from tests.cluster.test_exposure import SECRET, admin_token, call
from workers.app import Worker
from workers.config import WorkerConfig
from workers.embedded.services import free_port
from workers.harness.cluster import LOOPBACK
from workers.harness.cluster_client import ClusterClient
from workers.model import ROOM_EMPTIED_CACHE, ROOM_PURGED_CACHE


async def test_the_audit_counts_a_purge_and_a_clean_up(
    spark: SparkSession, database_url: str, redis_url: str, channel_prefix: str
) -> None:
    ports = {"p1": free_port(), "s1": free_port()}

    def config(name: str) -> WorkerConfig:
        return WorkerConfig(
            instance_name=name, database_url=database_url, redis_url=redis_url, channel_prefix=channel_prefix,
            stream_writers={"events": ["p1"]}, http_port=ports[name], position_announce_interval_s=0.2,
            registration="open", registration_shared_secret=SECRET, rc_exempt_addresses=LOOPBACK,
            instance_map={n: f"http://127.0.0.1:{p}" for n, p in ports.items()},
            worker_secret="test-worker-secret-0123456789",
        )  # fmt: skip

    writer, reader = Worker(config("p1")), Worker(config("s1"))
    await writer.start()
    await reader.start()
    try:
        base = f"http://127.0.0.1:{ports['p1']}"
        async with aiohttp.ClientSession() as http:
            alice, bob = (ClusterClient(http, {"p1": base}) for _ in range(2))
            await alice.register("alice")
            await bob.register("bob")
            root = await admin_token(http, base, "root")
            doomed = await alice.create_room("public")
            await bob.membership(doomed, "join")
            status, answer, _ = await call(
                http, "DELETE", f"{base}/_synapse/admin/v1/rooms/{doomed}", {}, root
            )
            assert status == 200, answer
            abandoned = await alice.create_room("public")
            await alice.membership(abandoned, "leave")
        written = writer.generators["caches"].get_current_token_for_writer("p1")
        for _ in range(100):  # until the reader applied every caches row p1 wrote
            if reader.generators["caches"].get_current_token_for_writer("p1") >= written:
                break
            await asyncio.sleep(0.05)
    finally:
        await reader.stop()  # records what it applied
        await writer.stop()

    result = analytics.run_audit(
        spark, analytics.PostgresSource(database_url), analytics.AuditOptions(top_n=50)
    )
    try:
        caches = {c["cache_func"]: (c["rows"], c["keys"]) for c in result.summary["top_caches"]}
        assert caches[ROOM_PURGED_CACHE] == (1, 3)  # the room, alice and bob
        assert caches[ROOM_EMPTIED_CACHE] == (1, 1)  # the room alone
        keys = {(k["cache_func"], k["key"]) for k in result.summary["top_keys"]}
        assert {(ROOM_PURGED_CACHE, k) for k in (doomed, "@alice:localhost", "@bob:localhost")} <= keys
        assert (ROOM_EMPTIED_CACHE, abandoned) in keys
        reconciliation = result.summary["reconciliation"]
        assert reconciliation["ok"], reconciliation
        lag = {w["worker_name"]: w["lag_rows"] for w in reconciliation["workers"]}
        assert lag == {"p1": 0, "s1": 0}, reconciliation
    finally:
        analytics.release(result)
