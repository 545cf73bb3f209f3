"""Exports across a database restore: the exported days from the backup's day on are dropped and
written again from the restored database, so the audit of the exports matches the audit of the
restored log (never a row the restore lost, never a row twice). The backup and restore are the
documented commands (`workers.harness.backup`), run on the real server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import analytics
from analytics.partials import EVENT_PARTIALS, INVALIDATION_PARTIALS
from tests.analytics.conftest import audit, scratch_database
from tests.conftest import Servers
from workers.harness import backup

DAY = 86_400_000
D1 = 19_676 * DAY  # 2023-11-15 00:00 UTC


async def _add(url: str, first_id: int, day_start: int, count: int) -> None:
    """`count` invalidations and as many events, one second apart from `day_start`."""
    rows = [(first_id + i, day_start + i * 1000) for i in range(count)]
    conn = await asyncpg.connect(url)
    try:
        await conn.executemany(
            "INSERT INTO cache_invalidation_stream_by_instance (stream_id, instance_name, cache_func,"
            " keys, invalidation_ts) VALUES ($1, 'p1', 'c', ARRAY['k'], $2)",
            rows,
        )
        await conn.executemany(
            "INSERT INTO events (stream_ordering, event_id, instance_name, room_id, type, sender, json,"
            " received_ts) VALUES ($1::bigint, '$e' || $1::bigint, 'p1', '!r', 'm.room.message', '@a', '{}',"
            " $2)",
            rows,
        )
    finally:
        await conn.close()


@pytest.fixture
def restored(servers: Servers) -> Iterator[tuple[str, str]]:
    """(name, URL) of the database to restore into; dropped afterwards."""
    name = f"r_{uuid.uuid4().hex[:16]}"
    yield name, servers.database_url(name)
    asyncio.run(servers.drop_database(name))


def _per_day(spark: SparkSession, location: str, table: str) -> dict[str, int]:
    frame = spark.read.parquet(f"{location}/{table}")
    return {str(r["day"]): r["n"] for r in frame.groupBy("day").agg(F.count(F.lit(1)).alias("n")).collect()}


def test_exports_after_the_backup_are_dropped_on_restore(
    spark: SparkSession, servers: Servers, restored: tuple[str, str], tmp_path: Path
) -> None:
    restored_name, restored_url = restored
    out = str(tmp_path / "export")
    dump = str(tmp_path / "fanout.dump")
    with scratch_database(servers) as url:
        asyncio.run(_add(url, 1, D1, 5))
        asyncio.run(_add(url, 101, D1 + DAY, 3))
        steps = backup.procedure(url, dump, servers.admin_url, restored_name, restored_url)
        asyncio.run(backup.run(steps["backup"]))  # the backup: on 2023-11-16
        asyncio.run(_add(url, 104, D1 + DAY + 3_600_000, 2))  # lost by the restore
        asyncio.run(_add(url, 201, D1 + 2 * DAY, 4))  # a day the restored database never sees
        assert analytics.main(["export", "--database-url", url, "--out", out]) == 0
        assert _per_day(spark, out, "events") == {"2023-11-15": 5, "2023-11-16": 5, "2023-11-17": 4}
    asyncio.run(backup.run(steps["restore"]))
    asyncio.run(_add(restored_url, 10**9 + 200, D1 + DAY + 7_200_000, 1))  # written after the restore

    # Without --after-restore the day the restored database has no rows for stays: counted twice over.
    export = ["export", "--database-url", restored_url, "--out", out, "--since", "2023-11-16"]
    assert analytics.main(export) == 0
    assert _per_day(spark, out, "invalidations") == {"2023-11-15": 5, "2023-11-16": 4, "2023-11-17": 4}

    assert analytics.main([*export, "--after-restore"]) == 0
    for table in ("invalidations", "events", INVALIDATION_PARTIALS, EVENT_PARTIALS):
        assert set(_per_day(spark, out, table)) == {"2023-11-15", "2023-11-16"}, table
    for table in ("invalidations", "events"):
        assert _per_day(spark, out, table) == {"2023-11-15": 5, "2023-11-16": 4}, table
    database = audit(spark, analytics.PostgresSource(restored_url, num_partitions=2))
    assert (database[0]["totals"]["rows"], database[0]["totals"]["events"]) == (9, 9)
    summary, stats, read = audit(spark, analytics.ParquetSource(out))
    assert (summary, stats) == database[:2]  # from the partial counts, as the read says
    for table in ("invalidations", "events"):
        assert read[table] == {"from_partials": ["2023-11-15", "2023-11-16"], "from_rows": [], "why": ""}


def test_after_restore_needs_the_backup_day(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["export", "--database-url", "postgresql://u@127.0.0.1:1/db", "--out", "x", "--after-restore"]
    assert analytics.main(argv) == 2
    assert "--after-restore needs --since" in capsys.readouterr().err
