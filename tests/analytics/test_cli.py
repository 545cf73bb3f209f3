"""`fanout audit` as a command: outputs, export and Parquet runs, and exit 2 with one message on bad usage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import analytics


def test_run_writes_every_output_and_exits_zero(
    spark: SparkSession, known_log_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = analytics.main(["--database-url", known_log_url, "--out", str(tmp_path), "--top-n", "3"])
    assert rc == 0
    assert f"report: {tmp_path / 'report.md'}" in capsys.readouterr().out
    for table in ("window_stats", "window_totals", "storms", "savings_by_cache", "top_caches", "top_keys"):
        assert (tmp_path / table / "_SUCCESS").exists(), table
    assert spark.read.parquet(str(tmp_path / "window_stats")).count() == 10
    assert spark.read.parquet(str(tmp_path / "gaps")).count() == 0
    for chart in ("rows_per_window.png", "top_caches.png", "savings.png"):
        assert (tmp_path / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", chart
    report = (tmp_path / "report.md").read_text()
    assert "| invalidation rows | 40 |" in report and "No gaps." in report
    assert json.loads((tmp_path / "summary.json").read_text())["totals"]["rows"] == 40


def test_export_then_parquet_run_gives_the_same_summary(
    spark: SparkSession, known_log_url: str, known_audit: analytics.AuditResult, tmp_path: Path
) -> None:
    exported = tmp_path / "export"
    assert analytics.main(["export", "--database-url", known_log_url, "--out", str(exported)]) == 0
    counts = {name: spark.read.parquet(str(exported / name)).count() for name in ("invalidations", "events")}
    assert counts == {"invalidations": 42, "events": 18}  # the export keeps the duplicates
    report = tmp_path / "report"
    assert analytics.main(["run", "--parquet", str(exported), "--out", str(report), "--top-n", "3"]) == 0
    from_parquet = json.loads((report / "summary.json").read_text())
    expected = json.loads(json.dumps(known_audit.summary, default=str))
    for summary in (from_parquet, expected):
        summary.pop("elapsed_s")
    read = from_parquet.pop("read")
    assert expected.pop("read")["source"] == "postgres"
    assert read["invalidations"] == {"from_partials": ["2023-11-14"], "from_rows": [], "why": ""}
    assert from_parquet == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "no source"),
        (["run", "--database-url", "mysql://x/y"], "not a database URL"),
        (
            ["run", "--database-url", "postgresql://u@h/db", "--jdbc-jar", "/nope.jar"],
            "JDBC driver not found",
        ),
        (["run", "--parquet", "/nonexistent"], "has no invalidations/"),
        (["run", "--window", "0"], "bad window"),
        (["run", "--storm-quantile", "1.5"], "quantile"),
        (["bogus"], "unrecognized arguments: bogus"),
    ],
)
def test_bad_usage_exits_2_with_one_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FANOUT_DATABASE_URL", raising=False)
    assert analytics.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_jdbc_url() -> None:
    assert analytics.jdbc_url("postgresql://postgres@127.0.0.1:5433/db") == (
        "jdbc:postgresql://127.0.0.1:5433/db",
        {"driver": "org.postgresql.Driver", "user": "postgres"},
    )
    assert analytics.jdbc_url("postgres://a%40b:p%2Fw@db.example/x?sslmode=require") == (
        "jdbc:postgresql://db.example:5432/x?sslmode=require",
        {"driver": "org.postgresql.Driver", "user": "a@b", "password": "p/w"},
    )


def test_parse_window() -> None:
    assert [analytics.parse_window(t) for t in ("60s", "1m", "5m", "1h", "250ms", "1000")] == [
        60_000,
        60_000,
        300_000,
        3_600_000,
        250,
        1000,
    ]
