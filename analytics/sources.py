"""Where the audit reads from: Postgres over JDBC (partitioned on the stream id) or Parquet exports.

Every loader returns a DataFrame with the columns of its schema in `schema.py`; nothing is
collected to the driver here. `export` writes the three tables as Parquet for later runs, with the
partial counts of the two dated ones.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from analytics.errors import AuditError, SourceUnreachable
from analytics.locations import exists, join, remove_partitions
from analytics.partials import (
    EVENT_PARTIALS,
    INVALIDATION_PARTIALS,
    day_of,
    write_days,
    write_event_partials,
    write_invalidation_partials,
    write_manifests,
)
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
#: The driver's own message, under Spark's redacted wrapper (FAILED_JDBC.CONNECTION) and py4j's.
_PSQL_EXCEPTION = re.compile(r"org\.postgresql\.util\.PSQLException: ([^\n]*)")
#: What the driver says -> (what the user reads, whether it is unreachable rather than misconfigured).
_CAUSES: tuple[tuple[re.Pattern[str], str, bool], ...] = (
    (
        re.compile(r"Connection to (\S+) refused"),
        "connection refused at {0} (is PostgreSQL running there?)",
        True,
    ),
    (re.compile(r'database "([^"]*)" does not exist'), 'database "{0}" does not exist', False),
    (re.compile(r'authentication failed for user "([^"]*)"'), 'authentication failed for user "{0}"', False),
    (re.compile(r'role "([^"]*)" does not exist'), 'role "{0}" does not exist', False),
    (
        re.compile(r"The connection attempt failed|UnknownHost|timed out", re.I),
        "the database did not answer",
        True,
    ),
)


def redact(database_url: str) -> str:
    """`database_url` with its password, if any, replaced by `***`."""
    parts = urlsplit(database_url)
    if parts.password is None:
        return database_url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return parts._replace(netloc=f"{name}:***@{host}").geturl()


def _java_causes(error: BaseException) -> str:
    """`error`'s text and, for an exception captured from the JVM, every message down its cause
    chain as `Class: message` lines (Spark's own message is redacted; the driver's says why)."""
    lines = [str(error)]
    cause = getattr(error, "_origin", None) or getattr(error, "java_exception", None)
    for _ in range(10):  # a chain is short; a cycle must not hang the report of an error
        if cause is None:
            break
        try:
            lines.append(f"{cause.getClass().getName()}: {cause.getMessage()}")
            cause = cause.getCause()
        except Exception:  # the gateway is gone: what we have must do
            break
    return "\n".join(lines)


def _jdbc_failure(source: PostgresSource, error: Exception) -> AuditError:
    """One line naming why a JDBC query failed, with the password hidden."""
    text = _java_causes(error)
    found = _PSQL_EXCEPTION.search(text) or _JAVA_EXCEPTION.search(text)
    detail = (
        found.group(found.lastindex or 0)
        if found
        else (text.strip().splitlines() or [type(error).__name__])[0]
    )
    where = redact(source.database_url)
    for pattern, wording, unreachable in _CAUSES:
        match = pattern.search(detail) or pattern.search(text)
        if match:
            cause = wording.format(*match.groups())
            kind = SourceUnreachable if unreachable else AuditError
            return kind(f"cannot read {where}: {cause}")
    if "org.postgresql.Driver" in text:
        detail += (
            " (the JDBC jar is not on the driver's classpath: under spark-submit pass"
            f" --jars {source.jdbc_jar} or --packages org.postgresql:postgresql:<version>)"
        )
    return AuditError(f"cannot read {where}: {detail}")


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
    """A location written by `export` (a path or a URI): `invalidations/`, `events/`,
    `applied_ranges/`, the first two partitioned by `day`."""

    location: str


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
    except Exception as e:  # py4j wraps the JVM's exception: name its cause in one line
        raise _jdbc_failure(source, e) from e


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
        return _read_parquet(spark, join(source.location, "invalidations"), INVALIDATIONS_SCHEMA)
    columns = INVALIDATIONS_SCHEMA.fieldNames()
    return _jdbc_table(spark, source, INVALIDATIONS_TABLE, columns, "stream_id")


def load_events(spark: SparkSession, source: Source) -> DataFrame:
    """(instance_name, received_ts) of every persisted event; empty if the source has none."""
    if isinstance(source, ParquetSource):
        return _read_parquet(spark, join(source.location, "events"), EVENTS_SCHEMA)
    return _jdbc_table(spark, source, EVENTS_TABLE, EVENTS_SCHEMA.fieldNames(), "stream_ordering")


def load_applied_ranges(spark: SparkSession, source: Source) -> DataFrame:
    """The workers' applied-range record (see module docstring); empty if the source has none."""
    if isinstance(source, ParquetSource):
        return _read_parquet(spark, join(source.location, "applied_ranges"), APPLIED_SCHEMA)
    if not _table_exists(spark, source, APPLIED_TABLE):
        log.warning("table=%s missing: no reconciliation (apply migration 0002)", APPLIED_TABLE)
        return spark.createDataFrame([], APPLIED_SCHEMA)
    return _jdbc_reader(spark, source).option("dbtable", APPLIED_TABLE).load().select(*APPLIED_SCHEMA.names)


def _read_parquet(spark: SparkSession, location: str, schema: StructType) -> DataFrame:
    """The schema's columns of the Parquet data at `location` (an empty frame when there is none)."""
    if not exists(spark, location):
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(location).select(*schema.fieldNames())


def check_export_days(since_day: str | None, after_restore: bool) -> None:
    """Raise AuditError unless the days to export make sense (called before any Spark work)."""
    if after_restore and since_day is None:
        raise AuditError("--after-restore needs --since: the UTC day of the backup the database came from")


def export(
    spark: SparkSession,
    source: PostgresSource,
    out: str,
    since_day: str | None = None,
    after_restore: bool = False,
) -> dict[str, int]:
    """Write the tables as Parquet under `out` (a path or URI); returns the rows written per table.

    `invalidations` and `events` are partitioned by UTC `day`: each day present in this export
    replaces that day's partition (a re-run of a day never duplicates it), and days not in it are
    kept (a new day appends). `since_day` exports only the days from it on (an incremental run).
    `after_restore` (with `since_day`, the backup's day) first drops every exported day from
    `since_day` on: after the database was restored from a backup, those partitions may hold rows
    it no longer has, and a day it has no rows for would otherwise be kept. Days before the backup
    hold only rows the backup has, so they stay as they are.
    Beside each, its partial counts (`invalidation_partials`, `event_partials`: analytics/partials.py)
    are written for the same days and replaced and dropped with them.
    `applied_ranges` is small and updated in place by workers: it is replaced whole."""
    check_export_days(since_day, after_restore)
    written: dict[str, int] = {}
    dated = (
        ("invalidations", load_invalidations(spark, source), "invalidation_ts", INVALIDATION_PARTIALS,
         write_invalidation_partials),
        ("events", load_events(spark, source), "received_ts", EVENT_PARTIALS, write_event_partials),
    )  # fmt: skip
    for name, frame, ts_column, partials_name, write_partials in dated:
        log.info("step=export table=%s", name)
        frame = frame.withColumn("day", day_of(F.col(ts_column)))
        if since_day is not None:
            frame = frame.where(F.col("day") >= F.lit(since_day))
        frame = frame.persist()
        written[name] = frame.count()
        if after_restore and since_day is not None:
            for table in (name, partials_name):
                dropped = remove_partitions(spark, join(out, table), "day", since_day)
                log.info("step=export table=%s after_restore dropped_days=%s", table, dropped)
        write_days(frame, join(out, name))
        log.info("step=export table=%s", partials_name)
        written[partials_name], days = write_partials(frame, join(out, partials_name))
        write_manifests(spark, out, name, days)
        frame.unpersist()
    log.info("step=export table=applied_ranges")
    ranges = load_applied_ranges(spark, source)
    ranges.write.mode("overwrite").parquet(join(out, "applied_ranges"))
    written["applied_ranges"] = spark.read.parquet(join(out, "applied_ranges")).count()
    return written
