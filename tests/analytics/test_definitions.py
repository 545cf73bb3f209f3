"""The audit counts exactly what docs/audit.md defines: figures from the command a user types
(`python -m analytics run`) beside the plain-Python reference (reference.py) over the same rows,
on a log built to sit on every edge the definitions name; hostile keys render in report.md as one
table row each; an empty log has no window; a clean run prints no warning."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.analytics import reference
from tests.analytics.conftest import scratch_database
from tests.conftest import Servers
from workers.embedded.services import free_port

MIDNIGHT = 19_676 * 86_400_000  # 2023-11-15 00:00:00 UTC
MINUTE = 60_000
HOSTILE = ["a|b", "line\nbreak", 'quo"te', "back\\slash", "é", "€", "😀", "`tick`", "*star* _u_", "<b>", ""]


def _rows() -> list[reference.Row]:
    rows: list[reference.Row] = []

    def add(writer: str, cache: str, keys: list[str] | None, ts: int) -> None:
        rows.append((len(rows) + 1, writer, cache, keys, ts))

    # both sides of midnight, first and last millisecond of a window
    for ts in (MIDNIGHT - MINUTE, MIDNIGHT - 1, MIDNIGHT, MIDNIGHT + MINUTE - 1):
        add("p1", "get_user_by_id", ["@u"], ts)
    # a window of exactly 4 rows (a storm at threshold 3) and one of 3 (not), an empty one between
    for i in range(4):
        add("p2", "get_users_in_room", [f"!r{i}"], MIDNIGHT + 3 * MINUTE + i)
    for i in range(3):
        add("p2", "get_users_in_room", ["!r0"], MIDNIGHT + 5 * MINUTE + i)
    # hostile keys, batched and as tuple keys
    add("p1", "cs_cache_fake", ["!room", *HOSTILE], MIDNIGHT + 6 * MINUTE)
    for key in HOSTILE:
        add("p1", "get_user_by_id", [key], MIDNIGHT + 6 * MINUTE + 1)
    add("p2", "get_membership", ["!r|1", "@a\nb"], MIDNIGHT + 6 * MINUTE + 2)  # a two-part tuple key
    # a key listed twice in one batched row counts once; NULL, empty array, a 10,000-key row
    add("p1", "cs_cache_fake", ["!r", "@a", "@a", "@b"], MIDNIGHT + 7 * MINUTE)
    add("p1", "get_rooms_for_user", None, MIDNIGHT + 7 * MINUTE)
    add("p2", "cs_cache_fake", [], MIDNIGHT + 7 * MINUTE)
    add("p2", "cs_cache_fake", ["!big", *[f"@m{i}" for i in range(9_999)]], MIDNIGHT + 8 * MINUTE)
    # one writer with no invalidation at all is just absent; duplicated copies of two rows
    rows += [rows[0], rows[-1]]
    return rows


async def _fill(url: str, rows: list[reference.Row]) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.executemany(
            "INSERT INTO cache_invalidation_stream_by_instance"
            " (stream_id, instance_name, cache_func, keys, invalidation_ts) VALUES ($1, $2, $3, $4, $5)",
            rows,
        )
    finally:
        await conn.close()


def _audit(url: str, out: Path, *extra: str, command: str = "run") -> subprocess.CompletedProcess[str]:
    """The command a user types (`url` a database URL, or with `--parquet` in `extra` ""). Its UI on
    a free port: on Spark's 4040, taken by any other Spark application on the machine, the run
    would warn that it moved to 4041."""
    source = ["--database-url", url] if url else []
    command_line = [sys.executable, "-m", "analytics", command, *source, "--out", str(out),
                    "--master", "local[2]", "--spark-conf", "spark.sql.shuffle.partitions=4",
                    "--spark-conf", f"spark.ui.port={free_port()}", *extra]  # fmt: skip
    return subprocess.run(command_line, capture_output=True, text=True, timeout=300)


def _warnings(stderr: str) -> list[str]:
    """Warning lines of a run. The JVM's own notice that Spark loads an incubator module
    (`WARNING: Using incubator modules`) is printed by Java before any configuration applies."""
    return [
        line
        for line in stderr.splitlines()
        if re.search(r"Warning|WARN", line) and not line.startswith("WARNING: Using incubator modules")
    ]


@pytest.fixture(scope="module")
def hostile_run(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ...]]:
    rows = _rows()
    out = tmp_path_factory.mktemp("hostile")
    with scratch_database(servers) as url:
        asyncio.run(_fill(url, rows))
        done = _audit(url, out, "--window", "1m", "--storm-threshold", "3", "--top-n", "11000")
    yield rows, out, done


def test_figures_equal_the_reference(hostile_run: tuple[Any, ...]) -> None:
    rows, out, done = hostile_run
    assert done.returncode == 0, done.stderr[-2000:]
    _equal_the_reference(json.loads((out / "summary.json").read_text()), rows)


def test_figures_from_partial_counts_equal_the_reference(servers: Servers, tmp_path: Path) -> None:
    rows = _rows()
    with scratch_database(servers) as url:
        asyncio.run(_fill(url, rows))
        exported = _audit(url, tmp_path / "export", command="export")
    assert exported.returncode == 0, exported.stderr[-2000:]
    extra = ("--window", "1m", "--storm-threshold", "3", "--top-n", "11000")
    done = _audit("", tmp_path / "report", "--parquet", str(tmp_path / "export"), *extra)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    read = summary["read"]["invalidations"]
    assert read["from_rows"] == [] and len(read["from_partials"]) == 2  # the log spans midnight
    _equal_the_reference(summary, rows)


def _equal_the_reference(summary: dict[str, Any], rows: list[Any]) -> None:
    expected = reference.audit(rows, MINUTE, 3, 11000)
    totals = summary["totals"]
    for name in ("rows", "keys", "batched_rows", "single_key_rows", "invalidate_all_rows", "bytes",
                 "per_key_messages", "saved_messages", "duplicate_copies", "windows",
                 "first_window_start", "last_window_start"):  # fmt: skip
        assert totals[name] == expected[name], name
    assert [(s["window_start"], s["rows"]) for s in summary["storms"]] == expected["storms"]
    assert [(k["cache_func"], k["key"], k["invalidations"]) for k in summary["top_keys"]] == expected[
        "top_keys"
    ]
    assert [(c["cache_func"], c["rows"]) for c in summary["top_caches"]] == expected["top_caches"]


def test_a_key_repeated_in_a_row_counts_once(hostile_run: tuple[Any, ...]) -> None:
    _, out, _ = hostile_run
    summary = json.loads((out / "summary.json").read_text())
    counts = {(k["cache_func"], k["key"]): k["invalidations"] for k in summary["top_keys"]}
    assert counts[("cs_cache_fake", "@a")] == 1


def test_hostile_keys_are_one_table_row_each(hostile_run: tuple[Any, ...]) -> None:
    _, out, _ = hostile_run
    report = (out / "report.md").read_text()
    table = report.split("## Hottest keys", 1)[1].split("##", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]  # after header and rule
    assert len(rows) == len(
        {(k["cache_func"], k["key"]) for k in json.loads((out / "summary.json").read_text())["top_keys"]}
    )
    for line in rows:
        assert len(re.findall(r"(?<!\\)\|", line)) == 4, line  # three cells, no pipe leaking out
    assert r"a\|b" in table and r"line\\nbreak" in table and "😀" in table and r"\`tick\`" in table


def test_a_clean_run_prints_no_warning(hostile_run: tuple[Any, ...]) -> None:
    _, _, done = hostile_run
    assert _warnings(done.stderr) == []
    assert "Traceback" not in done.stderr


def test_an_empty_log_has_no_window(servers: Servers, tmp_path: Path) -> None:
    with scratch_database(servers) as url:
        done = _audit(url, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    totals = json.loads((tmp_path / "summary.json").read_text())["totals"]
    assert totals["windows"] == 0 and totals["rows"] == 0
    assert totals["first_window_start"] is None and totals["last_window_start"] is None
    report = (tmp_path / "report.md").read_text()
    assert "The log is empty" in report and "1970" not in report


def test_warning_filter_sees_python_and_spark_warnings() -> None:
    assert _warnings("x.py:1: FutureWarning: old\n26/11/25 WARN Utils: loopback") != []
    assert _warnings("WARNING: Using incubator modules: jdk.incubator.vector") == []
