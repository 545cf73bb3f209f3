"""The audit from an export's partial counts gives every figure the raw rows give: on the known log,
for windows the partials nest in and one they do not, on a log across midnight with duplicates, a
re-exported day, partials a failed export left stale, and an export made before partials existed."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from pyspark.sql import SparkSession

import analytics
from analytics.generate import generate_log
from analytics.partials import EVENT_PARTIALS, INVALIDATION_PARTIALS
from tests.analytics.conftest import audit, scratch_database
from tests.conftest import Servers

DAY = 86_400_000
D1 = 19_676 * DAY  # 2023-11-15 00:00 UTC
DAYS = ("2023-11-15", "2023-11-16", "2023-11-17")


def without_partials(export: Path, copy: Path) -> Path:
    """A copy of `export` as an export made before partial counts existed."""
    shutil.copytree(export, copy)
    for name in (INVALIDATION_PARTIALS, EVENT_PARTIALS):
        shutil.rmtree(copy / name)
    return copy


@pytest.fixture(scope="module")
def known_export(known_log_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("known") / "export"
    assert analytics.main(["export", "--database-url", known_log_url, "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("window_ms", [60_000, 120_000, 300_000])
def test_partials_give_the_raw_rows_figures(
    spark: SparkSession, known_export: Path, tmp_path: Path, window_ms: int
) -> None:
    from_partials = audit(spark, analytics.ParquetSource(str(known_export)), window_ms)
    raw = without_partials(known_export, tmp_path / "raw")
    from_rows = audit(spark, analytics.ParquetSource(str(raw)), window_ms)
    assert from_partials[:2] == from_rows[:2]
    assert from_partials[0]["totals"]["rows"] == 40 and from_partials[0]["totals"]["duplicate_copies"] == 2
    assert from_partials[2]["invalidations"] == {"from_partials": ["2023-11-14"], "from_rows": [], "why": ""}
    assert from_partials[2]["events"]["from_partials"] == ["2023-11-14"]
    assert from_rows[2]["invalidations"]["from_rows"] == ["2023-11-14"]
    assert "exported without them" in from_rows[2]["invalidations"]["why"]


def test_partials_match_the_database_audit(
    spark: SparkSession, known_export: Path, known_audit: analytics.AuditResult
) -> None:
    summary, _, _ = audit(spark, analytics.ParquetSource(str(known_export)))
    expected = json.loads(json.dumps(known_audit.summary, default=str))
    expected.pop("elapsed_s"), expected.pop("read")
    summary["top_keys"] = summary["top_keys"][:3]  # the known audit keeps 3
    summary["top_caches"] = summary["top_caches"][:3]
    assert summary == expected


def test_a_window_the_partials_do_not_nest_in_reads_the_rows(
    spark: SparkSession, known_export: Path, tmp_path: Path
) -> None:
    summary, stats, read = audit(spark, analytics.ParquetSource(str(known_export)), 90_000)
    assert read["invalidations"]["from_rows"] == ["2023-11-14"]
    assert "window 90000 ms is not a whole number" in read["invalidations"]["why"]
    raw = without_partials(known_export, tmp_path / "raw")
    assert audit(spark, analytics.ParquetSource(str(raw)), 90_000)[:2] == (summary, stats)


async def _log(url: str, first_id: int, t0_ms: int, rows: int, duplicate_every: int = 0) -> None:
    """`rows` generated rows (events too) from `t0_ms`, 200 ms apart, and a second copy of every
    `duplicate_every`-th stream id among them."""
    conn = await asyncpg.connect(url)
    try:
        await generate_log(conn, rows, first_id=first_id, t0_ms=t0_ms, step_ms=200, events_every=3)
        if duplicate_every:
            await conn.execute(
                "INSERT INTO cache_invalidation_stream_by_instance SELECT * FROM"
                " cache_invalidation_stream_by_instance"
                " WHERE stream_id BETWEEN $1 AND $2 AND stream_id % $3 = 0",
                first_id,
                first_id + rows - 1,
                duplicate_every,
            )
    finally:
        await conn.close()


@pytest.fixture
def midnight_log(servers: Servers) -> Iterator[str]:
    """3,000 rows across midnight into 2023-11-16 (10 minutes), with duplicates."""
    with scratch_database(servers) as url:
        asyncio.run(_log(url, 1, D1 + DAY - 300_000, 3000, duplicate_every=97))
        yield url


def test_reexported_day_stale_partials_and_an_old_export(
    spark: SparkSession, midnight_log: str, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    assert analytics.main(["export", "--database-url", midnight_log, "--out", str(out)]) == 0
    day2 = f"day={DAYS[1]}"
    left_behind = tmp_path / "left_behind"
    shutil.copytree(out / INVALIDATION_PARTIALS / day2, left_behind)

    # More rows on the second day and a new third day; the second day is exported again.
    asyncio.run(_log(midnight_log, 10_001, D1 + DAY + 3_600_000, 500, duplicate_every=7))
    asyncio.run(_log(midnight_log, 20_001, D1 + 2 * DAY, 400))
    again = ["export", "--database-url", midnight_log, "--out", str(out), "--since", DAYS[1]]
    assert analytics.main(again) == 0
    database = audit(spark, analytics.PostgresSource(midnight_log, num_partitions=2))
    assert database[0]["totals"]["rows"] == 3900 and database[0]["totals"]["duplicate_copies"] > 0
    summary, stats, read = audit(spark, analytics.ParquetSource(str(out)))
    assert (summary, stats) == database[:2]
    assert read["invalidations"] == {"from_partials": list(DAYS), "from_rows": [], "why": ""}
    assert read["events"] == {"from_partials": list(DAYS), "from_rows": [], "why": ""}

    # Partials a failed export left behind (the second day's from before its re-export): that day
    # is read from its rows, and the figures do not move.
    shutil.rmtree(out / INVALIDATION_PARTIALS / day2)
    shutil.copytree(left_behind, out / INVALIDATION_PARTIALS / day2)
    summary, stats, read = audit(spark, analytics.ParquetSource(str(out)))
    assert (summary, stats) == database[:2]
    assert read["invalidations"]["from_partials"] == [DAYS[0], DAYS[2]]
    assert read["invalidations"]["from_rows"] == [DAYS[1]]
    assert "do not match the rows for 1 day(s) (2023-11-16)" in read["invalidations"]["why"]

    # An export made before partials existed: every day from its rows, and the output says so.
    old = without_partials(out, tmp_path / "old")
    report = tmp_path / "report"
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("analytics.audit")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert analytics.main(["run", "--parquet", str(old), "--out", str(report), "--top-n", "5"]) == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    said = [line for line in lines if line.startswith("step=load read=")]
    assert len(said) == 1 and "invalidations: partial counts for 0 day(s), raw rows for 3" in said[0]
    assert "exported without them" in said[0]
    written = json.loads((report / "summary.json").read_text())
    assert written["read"]["invalidations"]["from_rows"] == list(DAYS)
    assert "raw rows for 3" in (report / "report.md").read_text()
    for key in ("totals", "storms", "top_keys", "top_caches", "savings_by_cache", "reconciliation"):
        assert written[key] == database[0][key], key
