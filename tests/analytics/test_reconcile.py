"""Reconciliation: what each worker applied against what was published; a planted gap is found exactly."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg
import pytest
from pyspark.sql import SparkSession

import analytics
from analytics.generate import generate_log
from tests.analytics.conftest import insert_ranges, scratch_database
from tests.conftest import Servers


def test_known_log_has_no_gap(known_audit: analytics.AuditResult) -> None:
    recon = known_audit.summary["reconciliation"]
    assert recon["ok"] and recon["gaps"] == [] and recon["missed_rows"] == 0
    got = {
        (r["worker_name"], r["instance_name"]): (
            r["runs"],
            r["ranges"],
            r["applied_upto"],
            r["published_in_span"],
            r["applied_rows"],
            r["missed_rows"],
            r["lag_rows"],
        )
        for r in recon["workers"]
    }
    # p1 published 35 rows (1, 2, 5, 6, 10, 11..40), p2 five (3, 4, 7, 8, 9). sync4 only has an events range.
    assert got == {
        ("sync1", "p1"): (1, 2, 40, 35, 35, 0, 0),
        ("sync1", "p2"): (1, 1, 40, 5, 5, 0, 0),
        ("sync2", "p1"): (1, 2, 40, 35, 35, 0, 0),  # its hole (3, 4] holds only p2's row 4
        ("sync2", "p2"): (1, 1, 8, 4, 4, 0, 1),  # row 9 not applied yet: lag, not a gap
        ("sync3", "p1"): (2, 2, 40, 25, 25, 0, 0),  # rows 11..20 fell between two runs: not needed
        ("sync3", "p2"): (2, 2, 40, 5, 5, 0, 0),
    }


def test_applied_holes_merge_overlapping_ranges(spark: SparkSession) -> None:
    ranges = spark.createDataFrame(
        [("w", "r", "p", 0, 10), ("w", "r", "p", 5, 8), ("w", "r", "p", 12, 20), ("w", "r2", "p", 30, 40)],
        "worker_name string, run_id string, instance_name string, from_id long, to_id long",
    )
    holes = [tuple(r) for r in analytics.applied_holes(ranges).collect()]
    assert holes == [("w", "r", "p", 10, 12)]


def test_a_worker_that_never_recorded_a_writer_lags_it(spark: SparkSession) -> None:
    published = spark.createDataFrame(
        [(1, "p1"), (2, "p2"), (3, "p2"), (4, "p1")], "stream_id long, instance_name string"
    )
    applied = spark.createDataFrame([("w", "r", "caches", "p1", 1, 4)], analytics.APPLIED_SCHEMA)
    per_worker, gaps = analytics.reconcile(published, applied)
    assert gaps.count() == 0
    rows = {r["instance_name"]: (r["published_in_span"], r["lag_rows"]) for r in per_worker.collect()}
    assert rows == {"p1": (1, 0), "p2": (0, 2)}


async def _planted(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await generate_log(conn, 1000, instances=("persister1", "persister2"), events_every=4)
    finally:
        await conn.close()
    # persister1 wrote the even ids, persister2 the odd ones.
    await insert_ranges(
        url,
        [
            ("sync1", "r1", "caches", "persister1", 0, 400),
            ("sync1", "r1", "caches", "persister1", 450, 1000),  # the planted gap: 402, 404, ..., 450
            ("sync1", "r1", "caches", "persister2", 0, 1000),
            ("sync2", "r1", "caches", "persister1", 0, 1000),
            ("sync2", "r1", "caches", "persister2", 0, 499),
            ("sync2", "r1", "caches", "persister2", 500, 1000),  # hole (499, 500] holds no persister2 row
        ],
    )


def test_planted_gap_is_reported_and_exits_nonzero(
    spark: SparkSession, servers: Servers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with scratch_database(servers) as url:
        asyncio.run(_planted(url))
        rc = analytics.main(["run", "--database-url", url, "--out", str(tmp_path), "--num-partitions", "3"])
    assert rc == 1
    expected_gap = {
        "worker_name": "sync1",
        "run_id": "r1",
        "instance_name": "persister1",
        "hole_from": 400,
        "hole_to": 450,
        "missed_rows": 25,
        "first_missed_id": 402,
        "last_missed_id": 450,
    }
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reconciliation"]["ok"] is False
    assert summary["reconciliation"]["gaps"] == [expected_gap]
    assert summary["reconciliation"]["missed_rows"] == 25
    sync1 = next(
        w
        for w in summary["reconciliation"]["workers"]
        if (w["worker_name"], w["instance_name"]) == ("sync1", "persister1")
    )
    assert (sync1["published_in_span"], sync1["applied_rows"], sync1["missed_rows"], sync1["gaps"]) == (
        500,
        475,
        25,
        1,
    )
    written = [r.asDict() for r in spark.read.parquet(str(tmp_path / "gaps")).collect()]
    assert written == [expected_gap]
    err = capsys.readouterr().err
    assert "GAP worker=sync1 run=r1 writer=persister1 stream_ids=(400,450] missed_rows=25" in err
    assert "**GAPS: 25 published rows never applied.**" in (tmp_path / "report.md").read_text()
    assert summary["totals"]["rows"] == 1000 and summary["subscribers"] == 2
