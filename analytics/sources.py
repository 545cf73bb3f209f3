"""Where the audit reads from: Postgres over JDBC (partitioned on the stream id) or Parquet exports.

Every loader returns a DataFrame with the columns of its schema in `schema.py`; nothing is
collected to the driver here. `export` writes the three tables as Parquet for later runs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pyspark.sql import DataFrame, DataFrameReader, SparkSession

from analytics.errors import AuditError
from analytics.schema import (
    APPLIED_SCHEMA,
    APPLIED_TABLE,
    EVENTS_SCHEMA,
    EVENTS_TABLE,
    INVALIDATIONS_SCHEMA,
    INVALIDATIONS_TABLE,
)
from analytics.session import DEFAULT_JDBC_JAR

log = logging.getLogger("analytics.audit")

_JAVA_EXCEPTION = re.compile(r"(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error): [^\n]*")


@dataclass(frozen=True)
class PostgresSource:
    """Read the tables over JDBC; `num_partitions` None means twice Spark's default parallelism."""

    database_url: str
    jdbc_jar: str = DEFAULT_JDBC_JAR
    num_partitions: int | None = None
    lower_bound: int | None = None
    upper_bound: int | None = None
    fetch_size: int = 10_000


@dataclass(frozen=True)
class ParquetSource:
    """A directory written by `export`: `invalidations/`, `events/`, `applied_ranges/`."""

    path: Path


Source = PostgresSource | ParquetSource


def jdbc_url(database_url: str) -> tuple[str, dict[str, str]]:
    """`postgresql://user[:pw]@host[:port]/db[?query]` -> (`jdbc:postgresql://host:port/db`, properties)."""
    parts = urlsplit(database_url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.path.strip("/"):
        raise AuditError(f"not a database URL: {database_url!r} (want postgresql://user@host:port/database)")
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    url = f"jdbc:postgresql://{host}:{parts.port or 5432}/{parts.path.strip('/')}"
    if parts.query:
        url += f"?{parts.query}"
    props = {"driver": "org.postgresql.Driver", "user": unquote(parts.username or "postgres")}
    if parts.password is not None:
        props["password"] = unquote(parts.password)
    return url, props


def _jdbc_reader(spark: SparkSession, source: PostgresSource) -> DataFrameReader:
    url, props = jdbc_url(source.database_url)
    reader = spark.read.format("jdbc").option("url", url).option("fetchsize", str(source.fetch_size))
    for key, value in props.items():
        reader = reader.option(key, value)
    return reader


def _jdbc_query_row(spark: SparkSession, source: PostgresSource, sql: str) -> Any:
    """One small row from Postgres, through Spark's own JDBC path (so a bad URL fails here, clearly)."""
    try:
        return _jdbc_reader(spark, source).option("query", sql).load().first()
    except Exception as e:  # py4j wraps the JVM's exception: keep the line that names it
        text = str(e)
        found = _JAVA_EXCEPTION.search(text)
        reason = found.group(0) if found else (text.strip().splitlines() or [type(e).__name__])[0]
        if "org.postgresql.Driver" in text:
            reason += (
                f" (the JDBC jar is not on the driver's classpath: under spark-submit pass "
                f"--jars {source.jdbc_jar})"
            )
        raise AuditError(f"cannot query {source.database_url}: {reason}") from e


def _jdbc_table(
    spark: SparkSession, source: PostgresSource, table: str, columns: Sequence[str], partition_column: str
) -> DataFrame:
    """`table` read in ranges of `partition_column`; bounds from the table unless the source fixes them."""
    row = _jdbc_query_row(
        spark, source, f"SELECT min({partition_column}) AS lo, max({partition_column}) AS hi FROM {table}"
    )
    lo = source.lower_bound if source.lower_bound is not None else row["lo"]
    hi = source.upper_bound if source.upper_bound is not None else row["hi"]
    reader = _jdbc_reader(spark, source).option("dbtable", table)
    if lo is not None and hi is not None and hi > lo:
        partitions = source.num_partitions or 2 * spark.sparkContext.defaultParallelism
        reader = (
            reader.option("partitionColumn", partition_column)
            .option("lowerBound", str(lo))
            .option("upperBound", str(hi + 1))
            .option("numPartitions", str(partitions))
        )
    return reader.load().select(*columns)


def _table_exists(spark: SparkSession, source: PostgresSource, table: str) -> bool:
    row = _jdbc_query_row(spark, source, f"SELECT to_regclass('{table}') IS NOT NULL AS present")
    return bool(row["present"])


def load_invalidations(spark: SparkSession, source: Source) -> DataFrame:
    """The raw invalidation log (duplicates included), columns as in `INVALIDATIONS_SCHEMA`."""
    if isinstance(source, ParquetSource):
        return spark.read.schema(INVALIDATIONS_SCHEMA).parquet(str(source.path / "invalidations"))
    columns = INVALIDATIONS_SCHEMA.fieldNames()
    return _jdbc_table(spark, source, INVALIDATIONS_TABLE, columns, "stream_id")


def load_events(spark: SparkSession, source: Source) -> DataFrame:
    """(instance_name, received_ts) of every persisted event; empty if the source has none."""
    if isinstance(source, ParquetSource):
        path = source.path / "events"
        if not path.exists():
            return spark.createDataFrame([], EVENTS_SCHEMA)
        return spark.read.schema(EVENTS_SCHEMA).parquet(str(path))
    return _jdbc_table(spark, source, EVENTS_TABLE, EVENTS_SCHEMA.fieldNames(), "stream_ordering")


def load_applied_ranges(spark: SparkSession, source: Source) -> DataFrame:
    """The workers' applied-range record (see module docstring); empty if the source has none."""
    if isinstance(source, ParquetSource):
        path = source.path / "applied_ranges"
        if not path.exists():
            return spark.createDataFrame([], APPLIED_SCHEMA)
        return spark.read.schema(APPLIED_SCHEMA).parquet(str(path))
    if not _table_exists(spark, source, APPLIED_TABLE):
        log.warning("table=%s missing: no reconciliation (apply migration 0002)", APPLIED_TABLE)
        return spark.createDataFrame([], APPLIED_SCHEMA)
    return _jdbc_reader(spark, source).option("dbtable", APPLIED_TABLE).load().select(*APPLIED_SCHEMA.names)


def export(spark: SparkSession, source: PostgresSource, out: Path) -> dict[str, int]:
    """Write the three tables as Parquet under `out` (overwriting); returns the rows written per table."""
    written: dict[str, int] = {}
    for name, frame in (
        ("invalidations", load_invalidations(spark, source)),
        ("events", load_events(spark, source)),
        ("applied_ranges", load_applied_ranges(spark, source)),
    ):
        log.info("step=export table=%s", name)
        frame.write.mode("overwrite").parquet(str(out / name))
        written[name] = spark.read.parquet(str(out / name)).count()
    return written
