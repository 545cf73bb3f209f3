"""One local Spark session for the whole suite, a hand-made invalidation log whose counts we know, and
the documented spark-submit line run once on it.

The known log (`KNOWN_*` below) is small and written out row by row, so every expected number in the tests
can be checked by reading this file; the tests state those numbers as literals.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pyspark.sql import SparkSession

import analytics
from tests.conftest import Servers

ROOT = Path(__file__).resolve().parents[2]
SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")

T0 = 1_700_000_040_000  # a whole minute (and a whole two minutes)
MINUTE = 60_000


def w(k: int, offset_ms: int = 0) -> int:
    return T0 + k * MINUTE + offset_ms


# (stream_id, writer, cache_func, keys, invalidation_ts); windows 0, 1, 2 and 4, window 3 empty.
KNOWN_ROWS: list[tuple[int, str, str, list[str] | None, int]] = [
    (1, "p1", "cs_cache_fake", ["!r1", "@a", "@b", "@c"], w(0, 1000)),
    (2, "p1", "get_users_in_room", ["!r1"], w(0, 2000)),
    (3, "p2", "get_user_by_id", ["@a"], w(0, 3000)),
    (4, "p2", "get_rooms_for_user", None, w(0, 4000)),
    (5, "p1", "cs_cache_fake", ["!r2"], w(1, 1000)),
    (6, "p1", "get_users_in_room", ["!r2"], w(1, 2000)),
    (7, "p2", "get_membership", ["!r2", "@d"], w(1, 3000)),
    (8, "p2", "cs_cache_fake", ["!r1", *[f"@m{i:02d}" for i in range(50)]], w(2, 1000)),
    (9, "p2", "cs_cache_fake", ["!r1", *[f"@m{i:02d}" for i in range(50, 60)]], w(2, 1001)),
    (10, "p1", "get_users_in_room", ["!r1"], w(2, 2000)),
    *[(i, "p1", "get_user_by_id", [f"@u{(i - 11) % 10}"], w(4, (i - 11) * 1000)) for i in range(11, 41)],
]
# The same stream id seen twice counts once.
KNOWN_DUPLICATES = [KNOWN_ROWS[1], KNOWN_ROWS[10]]
# (writer, window, events persisted)
KNOWN_EVENTS = [("p1", 0, 2), ("p1", 1, 1), ("p1", 4, 10), ("p2", 0, 1), ("p2", 2, 4)]
# (worker, run, stream, writer, from_id, to_id): no gap. sync2's hole (3,4] holds only p2's row 4, so it
# is no gap for p1; sync2 lags p2 by row 9; sync3 restarted (run b), and rows 11..20 between runs are fine.
KNOWN_RANGES = [
    ("sync1", "a", "caches", "p1", 0, 5),
    ("sync1", "a", "caches", "p1", 5, 40),
    ("sync1", "a", "caches", "p2", 0, 40),
    ("sync2", "a", "caches", "p1", 0, 3),
    ("sync2", "a", "caches", "p1", 4, 40),
    ("sync2", "a", "caches", "p2", 0, 8),
    ("sync3", "a", "caches", "p1", 0, 10),
    ("sync3", "a", "caches", "p2", 0, 10),
    ("sync3", "b", "caches", "p1", 20, 40),
    ("sync3", "b", "caches", "p2", 20, 40),
    ("sync4", "a", "events", "p1", 0, 1),
]


@contextlib.contextmanager
def scratch_database(servers: Servers) -> Iterator[str]:
    """A fresh migrated database (sync, for module/session fixtures), dropped afterwards."""
    name = f"a_{uuid.uuid4().hex[:16]}"
    url = asyncio.run(servers.create_database(name))
    try:
        yield url
    finally:
        asyncio.run(servers.drop_database(name))


async def insert_ranges(url: str, ranges: list[tuple[str, str, str, str, int, int]]) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.executemany(
            "INSERT INTO replication_applied_ranges"
            " (worker_name, run_id, stream_name, instance_name, from_id, to_id, updated_ts)"
            " VALUES ($1, $2, $3, $4, $5, $6, 0)",
            ranges,
        )
    finally:
        await conn.close()


async def _fill_known(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.executemany(
            "INSERT INTO cache_invalidation_stream_by_instance"
            " (stream_id, instance_name, cache_func, keys, invalidation_ts) VALUES ($1, $2, $3, $4, $5)",
            KNOWN_ROWS + KNOWN_DUPLICATES,
        )
        events: list[tuple[Any, ...]] = []
        for writer, window, count in KNOWN_EVENTS:
            for j in range(count):
                n = len(events) + 1
                events.append((n, f"$e{n}", writer, "!r1", "m.room.message", "@a", "{}", w(window, 500 + j)))
        await conn.executemany(
            "INSERT INTO events (stream_ordering, event_id, instance_name, room_id, type, sender, json,"
            " received_ts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            events,
        )
    finally:
        await conn.close()
    await insert_ranges(url, KNOWN_RANGES)


def audit(
    spark: SparkSession, source: analytics.ParquetSource | analytics.PostgresSource, window_ms: int = 60_000
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """(summary without its timing and read, window_stats rows in order, what was read)."""
    result = analytics.run_audit(spark, source, analytics.AuditOptions(window_ms=window_ms, top_n=5))
    try:
        stats = result.tables["window_stats"].orderBy("window_start", "cache_func", "instance_name")
        rows = [r.asDict() for r in stats.collect()]
        summary = json.loads(json.dumps(result.summary, default=str))
    finally:
        analytics.release(result)
    summary.pop("elapsed_s")
    return summary, rows, summary.pop("read")


#: For every JVM the analytics tests start (the session below, spark-submit, a standalone master and
#: worker, the notebook's kernel): the quick JIT tier and the serial collector. Each of those JVMs
#: lives for seconds on tiny data, where C2's compilations and G1's threads only cost CPU on a
#: 2-core machine: about 40% of each audit run. What Spark computes is the same.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session", autouse=True)
def quick_jvm() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        given = os.environ.get("JAVA_TOOL_OPTIONS")
        patch.setenv("JAVA_TOOL_OPTIONS", f"{QUICK_JVM} {given}" if given else QUICK_JVM)
        yield


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session, owned = analytics.spark_session(
        "local[2]",
        analytics.resolve_jdbc_jar(None),
        [("spark.sql.shuffle.partitions", "4"), ("spark.ui.enabled", "false")],
    )
    assert owned, "another Spark session was already active"
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def known_log_url(servers: Servers) -> Iterator[str]:
    with scratch_database(servers) as url:
        asyncio.run(_fill_known(url))
        yield url


@pytest.fixture(scope="session")
def known_audit(spark: SparkSession, known_log_url: str) -> Iterator[analytics.AuditResult]:
    """The audit of the known log: 1-minute windows, p99 storms, top 3, subscribers from the record."""
    source = analytics.PostgresSource(known_log_url, num_partitions=3)
    result = analytics.run_audit(spark, source, analytics.AuditOptions(top_n=3))
    yield result
    analytics.release(result)


@pytest.fixture(scope="session")
def audit_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zip `make audit-zip` builds (every module of the package), copied out of the checkout."""
    subprocess.run(["make", "-s", "audit-zip", f"PYTHON={sys.executable}"], cwd=ROOT, check=True)
    built = ROOT / "dist" / "analytics.zip"
    names = set(zipfile.ZipFile(built).namelist())
    package = {f"analytics/{p.name}" for p in (ROOT / "analytics").glob("*.py")}
    assert package <= names, package - names
    copy = tmp_path_factory.mktemp("zip") / "analytics.zip"
    shutil.copy(built, copy)
    return copy


def spark_env(**more: str) -> dict[str, str]:
    """The environment of a Spark process started here: this Python for the executors, everything
    on loopback (and the JVM options of `quick_jvm`)."""
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", **more}


def submit(
    audit_zip: Path, master: str, url: str, out: Path, *extra: str, conf: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """The documented spark-submit line (docs/audit.md), run from outside the checkout; `conf`
    goes to spark-submit (`--conf`), `extra` to the audit (after `run`)."""
    entry = audit_zip.parent / "audit.py"
    shutil.copy(ROOT / "analytics" / "audit.py", entry)
    confs = [arg for pair in conf for arg in ("--conf", pair)]
    command = [str(SPARK_SUBMIT), "--master", master, "--py-files", str(audit_zip),
               "--jars", analytics.resolve_jdbc_jar(None), "--conf", "spark.sql.shuffle.partitions=4",
               *confs, str(entry), "run", "--database-url", url, "--out", str(out), *extra]  # fmt: skip
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=audit_zip.parent, env=spark_env()
    )


@pytest.fixture(scope="session")
def submitted_locally(
    audit_zip: Path, known_log_url: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """(the run, its output directory): the documented line with `--master local[2]` on the known
    log, once for the tests that check it and the one that compares a cluster's run with it."""
    out = tmp_path_factory.mktemp("submitted") / "out"
    return submit(audit_zip, "local[2]", known_log_url, out), out
