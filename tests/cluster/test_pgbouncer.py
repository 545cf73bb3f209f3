"""The cluster through a real PgBouncer in transaction mode: replication and the history check hold.

Every worker's pool goes through PgBouncer (`database_pooler: transaction`, so asyncpg's statement
cache is off); the migration lock and the instance-name lease use `database_direct_url`. PgBouncer
gets 4 server connections for the test database while the workers hold many more client
connections: each transaction runs on whichever server connection is free, which is what breaks
named prepared statements and session state if anything still relied on them.
"""

from __future__ import annotations

import aiohttp

from tests.cluster.conftest import MakeCluster
from workers.harness.loadgen import LoadDriver, LoadPlan
from workers.harness.pgbouncer_server import PgBouncer
from workers.routing import writer_for_room
from workers.storage import connect

#: 12 rooms, placed by a hash of their random ids: all on one writer in 1 run of 2,000 (with 6, 1
#: in 32: the likeliest cause of the one failure of the both-writers assertion, in a fresh clone).
PLAN = LoadPlan(users=8, rooms=12, rooms_per_user=3, actions=400, concurrency=8, sync_timeout_ms=500)


async def test_replication_and_history_through_pgbouncer_in_transaction_mode(
    make_cluster: MakeCluster, database_url: str, pgbouncer: PgBouncer
) -> None:
    database = database_url.rpartition("/")[2]
    pooled = {
        "database_url": pgbouncer.through(database_url),
        "database_pooler": "transaction",
        "database_direct_url": database_url,
        "db_pool_size": 4,
    }
    cluster = await make_cluster(background_workers=1, extra_config=pooled)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        driver = LoadDriver(
            session, cluster.urls, cluster.event_writers, cluster.sync_workers, database_url, PLAN
        )
        await driver.setup()
        report = await driver.run()
        (pool,) = [p for p in pgbouncer.show("POOLS") if p["database"] == database]
        clients = len([c for c in pgbouncer.show("CLIENTS") if c["database"] == database])
        async with connect(database_url) as conn:
            # PgBouncer's server connections and the workers' direct ones (the leases), apart.
            backends = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND client_port IS NOT NULL"
                " AND pid <> pg_backend_pid()",
                database,
            )
    assert report.problems == [], report.problems[:10]
    assert report.internal_errors == 0
    assert report.events_sent > 150 and report.syncs > 50 and report.events_checked > 0
    assert report.account_data_sent > 0  # a stored stream's writes (stream_writes) too
    assert pool["pool_mode"] == "transaction"
    servers = sum(int(pool[k] or 0) for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"))
    # Five workers with pools of 2 to 4 each: far more clients than PgBouncer's 4 server connections.
    assert servers <= pgbouncer.pool_size < 12 <= clients, (servers, clients)
    leases = len(cluster.workers)
    assert backends <= pgbouncer.pool_size + leases, backends
    async with connect(database_url) as conn:
        written = await conn.fetch(
            "SELECT room_id, instance_name, count(*) AS n FROM events WHERE type = 'm.room.message'"
            " GROUP BY 1, 2 ORDER BY 1, 2"
        )
    # Each room's messages by writer, beside the room's stable choice: a failure says whether the
    # rooms all hashed to one writer or moved off one (a writer found unavailable).
    placement = [
        (r["room_id"], r["instance_name"], r["n"], writer_for_room(r["room_id"], cluster.event_writers))
        for r in written
    ]
    assert {r["instance_name"] for r in written} == {"persister1", "persister2"}, placement
