"""Exports are partitioned by UTC day: a new day appends its partition, a re-run of a day replaces
it (never a duplicate), `--since` exports only the days from it on; locations are paths or URIs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import analytics
from tests.analytics.conftest import scratch_database
from tests.conftest import Servers

DAY = 86_400_000
D1 = 19_676 * DAY  # 2023-11-15 00:00 UTC


async def _insert(url: str, first_id: int, day_start: int, count: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.executemany(
            "INSERT INTO cache_invalidation_stream_by_instance (stream_id, instance_name, cache_func,"
            " keys, invalidation_ts) VALUES ($1, 'p1', 'c', ARRAY['k'], $2)",
            [(first_id + i, day_start + i * 1000) for i in range(count)],
        )
    finally:
        await conn.close()


@pytest.fixture
def log_url(servers: Servers) -> Iterator[str]:
    with scratch_database(servers) as url:
        asyncio.run(_insert(url, 1, D1, 5))
        asyncio.run(_insert(url, 101, D1 + DAY, 3))
        yield url


def _per_day(spark: SparkSession, location: str) -> dict[str, int]:
    frame = spark.read.parquet(f"{location}/invalidations")
    return {str(r["day"]): r["n"] for r in frame.groupBy("day").agg(F.count(F.lit(1)).alias("n")).collect()}


def test_a_new_day_appends_and_a_rerun_replaces(spark: SparkSession, log_url: str, tmp_path: Path) -> None:
    out = f"file://{tmp_path}/export"  # a URI, passed through untouched
    argv = ["export", "--database-url", log_url, "--out", out]
    assert analytics.main(argv) == 0
    assert _per_day(spark, out) == {"2023-11-15": 5, "2023-11-16": 3}
    asyncio.run(_insert(log_url, 201, D1 + 2 * DAY, 4))  # a new day
    assert analytics.main(argv) == 0  # the same export again: earlier days replaced, not doubled
    assert _per_day(spark, out) == {"2023-11-15": 5, "2023-11-16": 3, "2023-11-17": 4}


def test_since_exports_only_later_days_and_keeps_the_rest(
    spark: SparkSession, log_url: str, tmp_path: Path
) -> None:
    out = str(tmp_path / "export")
    assert analytics.main(["export", "--database-url", log_url, "--out", out]) == 0
    asyncio.run(_insert(log_url, 301, D1 + DAY + 5000, 2))  # more rows on the second day
    assert analytics.main(["export", "--database-url", log_url, "--out", out, "--since", "2023-11-16"]) == 0
    assert _per_day(spark, out) == {"2023-11-15": 5, "2023-11-16": 5}


def test_a_run_reads_and_writes_file_uris(spark: SparkSession, log_url: str, tmp_path: Path) -> None:
    exported, report = f"file://{tmp_path}/export", f"file://{tmp_path}/report"
    assert analytics.main(["export", "--database-url", log_url, "--out", exported]) == 0
    assert analytics.main(["run", "--parquet", exported, "--out", report]) == 0
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["totals"]["rows"] == 8
    assert (tmp_path / "report" / "report.md").exists() and (tmp_path / "report" / "window_totals").is_dir()


def test_locations_keep_uris_whole() -> None:
    from analytics.locations import join, local_path

    assert join("s3a://bucket/audit/", "invalidations") == "s3a://bucket/audit/invalidations"
    assert local_path("hdfs://nn:8020/x") is None
    assert local_path("file:///tmp/a%20b") == Path("/tmp/a b") and local_path("rel/dir") == Path("rel/dir")
