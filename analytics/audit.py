"""The invalidation audit: a PySpark job over the `caches` stream's log.

Run it as ``fanout audit [run] ...``, ``fanout audit export ...`` or
``spark-submit --jars /usr/share/java/postgresql.jar analytics/audit.py ...`` (under spark-submit the JVM is
already running, so the jar must come from ``--jars``; from Python we put it in ``spark.jars`` ourselves).
Everything the job does is a small function over DataFrames, so the notebook (`analytics/audit.ipynb`) and
the benchmark call the same code. The file is self-contained (pyspark only, matplotlib for charts) because
``spark-submit`` ships one file to a cluster's driver; nothing else of fanout has to be installed there.

Sources. Postgres over JDBC (the driver jar from ``--jdbc-jar`` / ``FANOUT_JDBC_JAR``, default Debian's
``/usr/share/java/postgresql.jar``), read in ``numPartitions`` ranges of ``stream_id`` between bounds taken
from the table (or given), or Parquet written by ``fanout audit export``. Only aggregates (one row per
window, cache, top-N entry, worker) ever come back to the driver, for the JSON, the charts and the report.

Definitions (the tests pin each one with exact counts):

* A row seen twice (same ``stream_id``) counts once: the caches stream hands out each ID once from one
  sequence, so two copies of an ID are the same row seen twice (an export loaded twice, a replayed insert).
  ``duplicate_copies`` counts the extra copies that were dropped.
* Keys invalidated by a row: a batched ("fake") cache, whose name ends in ``_cache_fake``, carries one key per
  element (``cs_cache_fake``: ``[room_id, member, ...]``); any other cache's ``keys`` is ONE key tuple, so 1;
  ``keys`` NULL ("invalidate the whole cache") invalidates 0 individual keys.
* Kinds: ``invalidate_all`` (keys NULL), ``batched`` (more than one key), ``single_key`` (the rest). They
  partition the rows.
* Bytes: UTF-8 length of the row's compact JSON payload ``[cache_func,keys,invalidation_ts]`` (the RDATA
  payload, without the command prefix, whose token format belongs to pubsub/).
* Saving from batching: messages sent = rows; per-key messages = what one message per key would have sent,
  ``max(keys, 1)`` per row. Fan-out multiplies both by the subscribed workers (``--subscribers``, else the
  distinct workers in the applied record).
* Amplification: invalidation rows per event persisted by the same writer instance in the same window
  (``events.received_ts``); NULL when that writer persisted no event there.
* Windows are ``[k*window, (k+1)*window)`` in epoch ms; window totals include the empty windows between the
  first and last one, so the p99 is not biased by leaving quiet minutes out.
* Storms: windows whose total rows exceed ``--storm-threshold`` or, if none is given, the exact
  ``--storm-quantile`` (default 0.99, linear interpolation) of the window totals.
* Top-N: caches by rows; keys by the rows that invalidated them (an element of a batched row, or the tuple of
  another cache's row: its sole element, or its compact JSON when it has several). Ties break by name.

Reconciliation, and why this record. A sync worker must persist what it applied; the cheapest record that
is honest is the table ``replication_applied_ranges`` (migration 0002, whose header is the contract): one
row per contiguously applied range ``(from_id, to_id]`` per worker, process run, stream and writer, extended
in place while the worker applies in order and started anew only when it skips. A persisted position alone
(``to_id`` only) costs the same but cannot show a hole in the middle: a worker that jumped from 400 to 450
would look perfect. Counting applied rows per worker would cost a write per row and still not say which
rows. With ranges, published rows of a writer inside a run's span but outside every range of that run are
exactly the missed invalidations; they are reported as gaps by worker and stream-id range, and the job exits
1. Rows between two runs are not gaps (a new process starts with empty caches); rows after the last range are
lag, reported but not failing (the record may trail the worker).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

log = logging.getLogger("analytics.audit")

CACHES_STREAM = "caches"
BATCHED_CACHE_SUFFIX = "_cache_fake"
INVALIDATIONS_TABLE = "cache_invalidation_stream_by_instance"
EVENTS_TABLE = "events"
APPLIED_TABLE = "replication_applied_ranges"
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
JDBC_JAR_ENV = "FANOUT_JDBC_JAR"
EXIT_OK, EXIT_GAP, EXIT_USAGE = 0, 1, 2

INVALIDATIONS_SCHEMA = T.StructType(
    [
        T.StructField("stream_id", T.LongType()),
        T.StructField("instance_name", T.StringType()),
        T.StructField("cache_func", T.StringType()),
        T.StructField("keys", T.ArrayType(T.StringType())),
        T.StructField("invalidation_ts", T.LongType()),
    ]
)
EVENTS_SCHEMA = T.StructType(
    [T.StructField("instance_name", T.StringType()), T.StructField("received_ts", T.LongType())]
)
APPLIED_SCHEMA = T.StructType(
    [
        T.StructField("worker_name", T.StringType()),
        T.StructField("run_id", T.StringType()),
        T.StructField("stream_name", T.StringType()),
        T.StructField("instance_name", T.StringType()),
        T.StructField("from_id", T.LongType()),
        T.StructField("to_id", T.LongType()),
    ]
)


_JAVA_EXCEPTION = re.compile(r"(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error): [^\n]*")


class AuditError(Exception):
    """Bad arguments or configuration (missing jar, unreachable database): the message says what to do."""


# ---------------------------------------------------------------------------------------------- sources


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


# ---------------------------------------------------------------------------------------------- metrics


def dedupe(invalidations: DataFrame) -> DataFrame:
    """One row per stream_id, plus `copies` (how often it was seen). Which copy survives is unspecified."""
    others = [c for c in INVALIDATIONS_SCHEMA.fieldNames() if c != "stream_id"]
    return (
        invalidations.groupBy("stream_id")
        .agg(F.first(F.struct(*others)).alias("row"), F.count(F.lit(1)).alias("copies"))
        .select("stream_id", *[F.col(f"row.{c}").alias(c) for c in others], "copies")
    )


def window_start(ts: Column, window_ms: int) -> Column:
    """Start (epoch ms) of the window holding `ts`; exact integer arithmetic, right for negative ts too."""
    return (ts - F.pmod(ts, F.lit(window_ms))).cast("long")


def _payload_bytes() -> Column:
    # len('[' + json(cache_func) + ',' + json(keys) + ',' + ts + ']') == len(to_json([cache_func])) + ... + 2
    return (
        F.octet_length(F.to_json(F.array(F.col("cache_func"))))
        + F.octet_length(F.coalesce(F.to_json(F.col("keys")), F.lit("null")))
        + F.length(F.col("invalidation_ts").cast("string"))
        + F.lit(2)
    ).cast("long")


def annotate(deduped: DataFrame, window_ms: int) -> DataFrame:
    """Per-row facts the aggregates sum: window, keys invalidated, kind, per-key messages, payload bytes."""
    batched_cache = F.col("cache_func").endswith(BATCHED_CACHE_SUFFIX)
    keys = (
        F.when(F.col("keys").isNull(), F.lit(0))
        .when(batched_cache, F.size("keys"))
        .otherwise(F.lit(1))
        .cast("long")
    )
    return (
        deduped.withColumn("window_start", window_start(F.col("invalidation_ts"), window_ms))
        .withColumn("keys_invalidated", keys)
        .withColumn(
            "kind",
            F.when(F.col("keys").isNull(), F.lit("invalidate_all"))
            .when(F.col("keys_invalidated") > 1, F.lit("batched"))
            .otherwise(F.lit("single_key")),
        )
        .withColumn("per_key_messages", F.greatest(F.col("keys_invalidated"), F.lit(1)).cast("long"))
        .withColumn("bytes", _payload_bytes())
    )


def window_stats(annotated: DataFrame, subscribers: int) -> DataFrame:
    """One row per (window_start, cache_func, instance_name): volumes, kinds, bytes, savings, fan-out."""

    def kind(name: str) -> Column:
        return F.sum(F.when(F.col("kind") == name, 1).otherwise(0)).cast("long")

    return (
        annotated.groupBy("window_start", "cache_func", "instance_name")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum("keys_invalidated").alias("keys"),
            kind("batched").alias("batched_rows"),
            kind("single_key").alias("single_key_rows"),
            kind("invalidate_all").alias("invalidate_all_rows"),
            F.sum("bytes").alias("bytes"),
            F.sum("per_key_messages").alias("per_key_messages"),
            F.sum(F.col("copies") - 1).alias("duplicate_copies"),
            F.min("stream_id").alias("first_stream_id"),
            F.max("stream_id").alias("last_stream_id"),
        )
        .withColumn("saved_messages", F.col("per_key_messages") - F.col("rows"))
        .withColumn("fanout_messages", F.col("rows") * F.lit(subscribers))
        .withColumn("per_key_fanout_messages", F.col("per_key_messages") * F.lit(subscribers))
    )


def events_per_window(events: DataFrame, window_ms: int) -> DataFrame:
    """(window_start, instance_name, events): events persisted per writer and window."""
    return (
        events.withColumn("window_start", window_start(F.col("received_ts"), window_ms))
        .groupBy("window_start", "instance_name")
        .agg(F.count(F.lit(1)).alias("events"))
    )


def with_amplification(stats: DataFrame, events_by_window: DataFrame) -> DataFrame:
    """`stats` plus `events` (same writer, same window) and `amplification` = rows / events (NULL if 0)."""
    return (
        stats.join(events_by_window, ["window_start", "instance_name"], "left")
        .withColumn("events", F.coalesce(F.col("events"), F.lit(0)).cast("long"))
        .withColumn("amplification", _ratio(F.col("rows"), F.col("events")))
    )


def _ratio(numerator: Column, denominator: Column) -> Column:
    return F.when(denominator > 0, numerator / denominator).otherwise(F.lit(None).cast("double"))


_TOTAL_COLUMNS = (
    "rows",
    "keys",
    "batched_rows",
    "single_key_rows",
    "invalidate_all_rows",
    "bytes",
    "per_key_messages",
    "saved_messages",
    "fanout_messages",
    "per_key_fanout_messages",
    "duplicate_copies",
)


def window_totals(stats: DataFrame, events_by_window: DataFrame, window_ms: int) -> DataFrame:
    """One row per window from the first to the last one seen, empty windows included with zeros."""
    bounds = stats.agg(F.min("window_start").alias("lo"), F.max("window_start").alias("hi")).first()
    spark = stats.sparkSession
    if bounds is None or bounds["lo"] is None:
        schema = T.StructType(
            [T.StructField("window_start", T.LongType())]
            + [T.StructField(c, T.LongType()) for c in (*_TOTAL_COLUMNS, "events")]
            + [T.StructField("amplification", T.DoubleType())]
        )
        return spark.createDataFrame([], schema)
    all_windows = spark.range(bounds["lo"], bounds["hi"] + window_ms, window_ms).select(
        F.col("id").alias("window_start")
    )
    sums = stats.groupBy("window_start").agg(*[F.sum(c).alias(c) for c in _TOTAL_COLUMNS])
    events = events_by_window.groupBy("window_start").agg(F.sum("events").alias("events"))
    filled = all_windows.join(sums, "window_start", "left").join(events, "window_start", "left")
    return filled.select(
        "window_start",
        *[F.coalesce(F.col(c), F.lit(0)).cast("long").alias(c) for c in (*_TOTAL_COLUMNS, "events")],
    ).withColumn("amplification", _ratio(F.col("rows"), F.col("events")))


@dataclass(frozen=True)
class StormThreshold:
    """Rows per window above which a window is a storm, and where the number came from."""

    rows: float
    source: str  # "configured" or "p<quantile>"


def storm_threshold(totals: DataFrame, configured: float | None, quantile: float) -> StormThreshold:
    """`configured` if given, else the exact `quantile` of rows per window (one scalar to the driver)."""
    if configured is not None:
        return StormThreshold(float(configured), "configured")
    row = totals.agg(F.percentile(F.col("rows"), F.lit(quantile)).alias("q")).first()
    value = 0.0 if row is None or row["q"] is None else float(row["q"])
    return StormThreshold(value, f"p{quantile * 100:g}")


def storms(totals: DataFrame, stats: DataFrame, threshold: StormThreshold) -> DataFrame:
    """Windows with rows > threshold, each with the cache that contributed most rows to it."""
    by_cache = stats.groupBy("window_start", "cache_func").agg(F.sum("rows").alias("cache_rows"))
    ranked = by_cache.withColumn(
        "rank",
        F.row_number().over(
            Window.partitionBy("window_start").orderBy(F.desc("cache_rows"), F.asc("cache_func"))
        ),
    ).where(F.col("rank") == 1)
    return (
        totals.where(F.col("rows") > F.lit(threshold.rows))
        .join(ranked, "window_start", "left")
        .select(
            "window_start",
            "rows",
            "keys",
            "per_key_messages",
            F.lit(threshold.rows).alias("threshold"),
            F.lit(threshold.source).alias("threshold_source"),
            F.col("cache_func").alias("top_cache"),
            F.col("cache_rows").alias("top_cache_rows"),
        )
    )


def savings_by_cache(stats: DataFrame) -> DataFrame:
    """Per cache: rows sent, per-key messages, messages saved by batching and the saved fraction."""
    return (
        stats.groupBy("cache_func")
        .agg(
            *[
                F.sum(c).alias(c)
                for c in ("rows", "keys", "per_key_messages", "saved_messages", "fanout_messages", "bytes")
            ]
        )
        .withColumn("saving_ratio", _ratio(F.col("saved_messages"), F.col("per_key_messages")))
    )


def top_caches(stats: DataFrame, n: int) -> DataFrame:
    """The `n` caches with the most rows (ties by name), with keys and bytes."""
    return (
        stats.groupBy("cache_func")
        .agg(F.sum("rows").alias("rows"), F.sum("keys").alias("keys"), F.sum("bytes").alias("bytes"))
        .orderBy(F.desc("rows"), F.asc("cache_func"))
        .limit(n)
    )


def top_keys(annotated: DataFrame, n: int) -> DataFrame:
    """The `n` (cache, key) pairs invalidated by the most rows (ties by cache, then key)."""
    batched = F.col("cache_func").endswith(BATCHED_CACHE_SUFFIX)
    tuple_key = F.when(F.size("keys") == 1, F.col("keys")[0]).otherwise(F.to_json(F.col("keys")))
    keys = F.when(batched, F.col("keys")).otherwise(F.array(tuple_key))
    return (
        annotated.where(F.col("keys").isNotNull())
        .select("cache_func", F.explode(keys).alias("key"))
        .groupBy("cache_func", "key")
        .agg(F.count(F.lit(1)).alias("invalidations"))
        .orderBy(F.desc("invalidations"), F.asc("cache_func"), F.asc("key"))
        .limit(n)
    )


# ---------------------------------------------------------------------------------------- reconciliation


def applied_holes(ranges: DataFrame) -> DataFrame:
    """(worker_name, run_id, instance_name, hole_from exclusive, hole_to inclusive) between a run's ranges."""
    by_run = Window.partitionBy("worker_name", "run_id", "instance_name").orderBy("from_id", "to_id")
    covered_upto = F.max("to_id").over(by_run.rowsBetween(Window.unboundedPreceding, -1))
    return (
        ranges.withColumn("covered_upto", covered_upto)
        .where(F.col("covered_upto").isNotNull() & (F.col("from_id") > F.col("covered_upto")))
        .select(
            "worker_name",
            "run_id",
            "instance_name",
            F.col("covered_upto").alias("hole_from"),
            F.col("from_id").alias("hole_to"),
        )
    )


def reconcile(
    published: DataFrame, applied: DataFrame, stream: str = CACHES_STREAM
) -> tuple[DataFrame, DataFrame]:
    """What each worker applied against what was published: (per worker and writer, gaps).

    `published` has (stream_id, instance_name), deduplicated. A gap is a hole between two ranges of one run
    that holds published rows of that writer: reported as (worker, run, writer, hole_from, hole_to] with the
    missed rows' count and first/last ID. Per (worker, writer): rows published inside the worker's run spans,
    rows applied, rows missed, and lag (rows after the highest applied ID; for a writer the worker never
    recorded, rows after the worker's first recorded position).
    """
    ranges = applied.where(F.col("stream_name") == stream).drop("stream_name")
    holes = applied_holes(ranges)
    gaps = (
        published.join(F.broadcast(holes), "instance_name")
        .where((F.col("stream_id") > F.col("hole_from")) & (F.col("stream_id") <= F.col("hole_to")))
        .groupBy("worker_name", "run_id", "instance_name", "hole_from", "hole_to")
        .agg(
            F.count(F.lit(1)).alias("missed_rows"),
            F.min("stream_id").alias("first_missed_id"),
            F.max("stream_id").alias("last_missed_id"),
        )
    )
    spans = ranges.groupBy("worker_name", "run_id", "instance_name").agg(
        F.min("from_id").alias("span_from"), F.max("to_id").alias("span_to")
    )
    in_span = (
        published.join(F.broadcast(spans), "instance_name")
        .where((F.col("stream_id") > F.col("span_from")) & (F.col("stream_id") <= F.col("span_to")))
        .groupBy("worker_name", "instance_name")
        .agg(F.count(F.lit(1)).alias("published_in_span"))
    )
    recorded = ranges.groupBy("worker_name", "instance_name").agg(
        F.countDistinct("run_id").alias("runs"),
        F.count(F.lit(1)).alias("ranges"),
        F.max("to_id").alias("applied_upto"),
    )
    first_position = ranges.groupBy("worker_name").agg(F.min("from_id").alias("first_position"))
    writers = published.select("instance_name").distinct()
    pairs = (
        first_position.crossJoin(writers)
        .join(recorded, ["worker_name", "instance_name"], "left")
        .withColumn("lag_after", F.coalesce(F.col("applied_upto"), F.col("first_position")))
    )
    lag = (
        published.join(
            F.broadcast(pairs.select("worker_name", "instance_name", "lag_after")), "instance_name"
        )
        .where(F.col("stream_id") > F.col("lag_after"))
        .groupBy("worker_name", "instance_name")
        .agg(F.count(F.lit(1)).alias("lag_rows"))
    )
    missed = gaps.groupBy("worker_name", "instance_name").agg(
        F.sum("missed_rows").alias("missed_rows"), F.count(F.lit(1)).alias("gaps")
    )
    keys = ["worker_name", "instance_name"]
    per_worker = (
        pairs.join(in_span, keys, "left")
        .join(missed, keys, "left")
        .join(lag, keys, "left")
        .select(
            "worker_name",
            "instance_name",
            F.coalesce(F.col("runs"), F.lit(0)).cast("long").alias("runs"),
            F.coalesce(F.col("ranges"), F.lit(0)).cast("long").alias("ranges"),
            "applied_upto",
            *[
                F.coalesce(F.col(c), F.lit(0)).cast("long").alias(c)
                for c in ("published_in_span", "missed_rows", "gaps", "lag_rows")
            ],
        )
        .withColumn("applied_rows", F.col("published_in_span") - F.col("missed_rows"))
    )
    return per_worker, gaps


# ---------------------------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class AuditOptions:
    """What the run computes; `subscribers` None means the distinct workers in the applied record."""

    window_ms: int = 60_000
    storm_threshold: float | None = None
    storm_quantile: float = 0.99
    top_n: int = 10
    subscribers: int | None = None


@dataclass
class AuditResult:
    """The output tables (DataFrames, not collected) and the summary (small, JSON-ready).

    Tables whose name starts with `_` are intermediate (persisted for reuse) and are not written out.
    `window_series` is the per-window totals, small enough for a chart.
    """

    tables: dict[str, DataFrame]
    summary: dict[str, Any]
    window_series: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reconciliation_ok(self) -> bool:
        return bool(self.summary["reconciliation"]["ok"])


def _rows(frame: DataFrame) -> list[dict[str, Any]]:
    """A small, already aggregated table as plain dicts (the only data that comes to the driver)."""
    return [row.asDict(recursive=True) for row in frame.collect()]


def run_audit(spark: SparkSession, source: Source, options: AuditOptions) -> AuditResult:
    """Load, deduplicate, aggregate and reconcile. The tables are persisted; call `release` when done."""
    started = time.monotonic()
    log.info("step=load source=%s", type(source).__name__)
    raw = load_invalidations(spark, source)
    deduped = dedupe(raw)
    annotated = annotate(deduped, options.window_ms).persist(StorageLevel.MEMORY_AND_DISK)
    applied = load_applied_ranges(spark, source).persist(StorageLevel.MEMORY_AND_DISK)
    if options.subscribers is not None:
        subscribers, subscribers_source = options.subscribers, "configured"
    else:
        subscribers = (
            applied.where(F.col("stream_name") == CACHES_STREAM).select("worker_name").distinct().count()
        )
        subscribers_source = "applied_record"
    events_by_window = events_per_window(load_events(spark, source), options.window_ms).persist()
    log.info("step=aggregate window_ms=%d subscribers=%d", options.window_ms, subscribers)
    stats = with_amplification(window_stats(annotated, subscribers), events_by_window).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    totals = window_totals(stats, events_by_window, options.window_ms).persist()
    threshold = storm_threshold(totals, options.storm_threshold, options.storm_quantile)
    log.info("step=reconcile")
    per_worker, gaps = reconcile(annotated.select("stream_id", "instance_name"), applied)
    tables = {
        "window_stats": stats,
        "window_totals": totals,
        "storms": storms(totals, stats, threshold),
        "savings_by_cache": savings_by_cache(stats),
        "top_caches": top_caches(stats, options.top_n),
        "top_keys": top_keys(annotated, options.top_n),
        "reconciliation": per_worker.persist(),
        "gaps": gaps.persist(),
        "_annotated": annotated,
        "_applied": applied,
        "_events_by_window": events_by_window,
    }
    log.info("step=summarize")
    summary = _summarize(tables, options, threshold, subscribers, subscribers_source)
    summary["elapsed_s"] = round(time.monotonic() - started, 3)
    series = _rows(totals.orderBy("window_start"))
    return AuditResult(tables, summary, series)


def release(result: AuditResult) -> None:
    """Unpersist everything `run_audit` cached (the session stays up)."""
    for frame in result.tables.values():
        frame.unpersist()


def _summarize(
    tables: dict[str, DataFrame],
    options: AuditOptions,
    threshold: StormThreshold,
    subscribers: int,
    subscribers_source: str,
) -> dict[str, Any]:
    totals_row = (
        tables["window_totals"]
        .agg(
            *[F.sum(c).alias(c) for c in (*_TOTAL_COLUMNS, "events")],
            F.count(F.lit(1)).alias("windows"),
            F.min("window_start").alias("first_window_start"),
            F.max("window_start").alias("last_window_start"),
        )
        .first()
    )
    totals = {k: (0 if v is None else v) for k, v in (totals_row.asDict() if totals_row else {}).items()}
    per_key = totals.get("per_key_messages", 0)
    totals["saving_ratio"] = (totals.get("saved_messages", 0) / per_key) if per_key else None
    events = totals.get("events", 0)
    totals["amplification"] = (totals.get("rows", 0) / events) if events else None
    per_worker = _rows(tables["reconciliation"].orderBy("worker_name", "instance_name"))
    gaps = _rows(tables["gaps"].orderBy("worker_name", "instance_name", "hole_from"))
    return {
        "window_ms": options.window_ms,
        "subscribers": subscribers,
        "subscribers_source": subscribers_source,
        "totals": totals,
        "storm_threshold": {"rows": threshold.rows, "source": threshold.source},
        "storms": _rows(tables["storms"].orderBy("window_start")),
        "savings_by_cache": _rows(tables["savings_by_cache"].orderBy(F.desc("saved_messages"), "cache_func")),
        "top_caches": _rows(tables["top_caches"].orderBy(F.desc("rows"), "cache_func")),
        "top_keys": _rows(tables["top_keys"].orderBy(F.desc("invalidations"), "cache_func", "key")),
        "reconciliation": {
            "ok": not gaps,
            "workers": per_worker,
            "gaps": gaps,
            "missed_rows": sum(int(g["missed_rows"]) for g in gaps),
        },
    }


# ---------------------------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class OutputPaths:
    """Where `write_outputs` put things."""

    out_dir: Path
    tables: dict[str, Path]
    summary: Path
    charts: list[Path]
    report: Path


def write_outputs(result: AuditResult, out_dir: Path) -> OutputPaths:
    """Parquet per table, `summary.json`, PNG charts and `report.md` under `out_dir` (overwritten)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tables: dict[str, Path] = {}
    for name, frame in result.tables.items():
        if name.startswith("_"):
            continue
        path = out_dir / name
        log.info("step=write table=%s", name)
        frame.write.mode("overwrite").parquet(str(path))
        tables[name] = path
    summary_path = out_dir / "summary.json"
    summary_path.write_text(json.dumps(result.summary, indent=2, sort_keys=True, default=str) + "\n")
    charts = render_charts(result, out_dir)
    report = render_report(result, charts, out_dir)
    return OutputPaths(out_dir, tables, summary_path, charts, report)


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def render_charts(result: AuditResult, out_dir: Path) -> list[Path]:
    """Rows per window (with the storm threshold), top caches, and batching savings per cache."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, series = result.summary, result.window_series
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(10, 4))
    xs = [(w["window_start"] - series[0]["window_start"]) / 60_000 for w in series] if series else []
    ax.plot(xs, [w["rows"] for w in series], label="rows sent")
    ax.plot(xs, [w["per_key_messages"] for w in series], label="per-key messages", alpha=0.6)
    ax.axhline(summary["storm_threshold"]["rows"], color="red", linestyle="--", label="storm threshold")
    storm_starts = {s["window_start"] for s in summary["storms"]}
    storm_points = [
        (x, w["rows"]) for x, w in zip(xs, series, strict=True) if w["window_start"] in storm_starts
    ]
    if storm_points:
        ax.scatter(*zip(*storm_points, strict=True), color="red", zorder=3, label="storm")
    start = _utc(series[0]["window_start"]) if series else "-"
    ax.set(xlabel=f"minutes since {start} UTC", ylabel="per window", title="Invalidations per window")
    ax.legend()
    paths.append(_save(fig, out_dir / "rows_per_window.png"))

    fig, ax = plt.subplots(figsize=(8, 4))
    caches = list(reversed(summary["top_caches"]))
    ax.barh([c["cache_func"] for c in caches], [c["rows"] for c in caches])
    ax.set(xlabel="rows", title="Hottest caches")
    paths.append(_save(fig, out_dir / "top_caches.png"))

    fig, ax = plt.subplots(figsize=(8, 4))
    savings = summary["savings_by_cache"][: max(1, len(summary["top_caches"]))]
    names = [s["cache_func"] for s in savings]
    positions = list(range(len(names)))
    ax.bar([p - 0.2 for p in positions], [s["rows"] for s in savings], width=0.4, label="sent")
    ax.bar([p + 0.2 for p in positions], [s["per_key_messages"] for s in savings], width=0.4, label="per-key")
    ax.set_xticks(positions, names, rotation=30, ha="right")
    ax.set(ylabel="messages", title="Saving from batching")
    ax.legend()
    paths.append(_save(fig, out_dir / "savings.png"))
    plt.close("all")
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def render_report(result: AuditResult, charts: Sequence[Path], out_dir: Path) -> Path:
    """A short Markdown report: headline numbers, storms, hot spots, reconciliation verdict."""
    s = result.summary
    t = s["totals"]
    recon = s["reconciliation"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x * 100:.1f}%"

    lines = [
        "# Invalidation audit",
        "",
        f"Windows: {t['windows']} of {s['window_ms'] / 1000:g} s"
        + (
            f", {_utc(t['first_window_start'])} to {_utc(t['last_window_start'])} UTC" if t["windows"] else ""
        ),
        "",
        "| measure | value |",
        "|---|---|",
        f"| invalidation rows | {t['rows']} |",
        f"| keys invalidated | {t['keys']} |",
        f"| batched / single-key / invalidate-all rows | "
        f"{t['batched_rows']} / {t['single_key_rows']} / {t['invalidate_all_rows']} |",
        f"| payload bytes | {t['bytes']} |",
        f"| duplicate copies dropped | {t['duplicate_copies']} |",
        f"| messages sent / per-key / saved | {t['rows']} / {t['per_key_messages']} / {t['saved_messages']} "
        f"({pct(t['saving_ratio'])}) |",
        f"| subscribers ({s['subscribers_source']}) / fan-out messages | {s['subscribers']} / "
        f"{t['fanout_messages']} |",
        f"| persisted events / amplification | {t['events']} / "
        f"{'n/a' if t['amplification'] is None else format(t['amplification'], '.3f')} |",
        "",
        f"## Storms (rows per window > {s['storm_threshold']['rows']:g}, {s['storm_threshold']['source']})",
        "",
    ]
    if s["storms"]:
        lines += ["| window (UTC) | rows | keys | top cache |", "|---|---|---|---|"]
        lines += [
            f"| {_utc(w['window_start'])} | {w['rows']} | {w['keys']} | "
            f"{w['top_cache']} ({w['top_cache_rows']}) |"
            for w in s["storms"]
        ]
    else:
        lines.append("None.")
    lines += ["", "## Hottest caches", "", "| cache | rows | keys |", "|---|---|---|"]
    lines += [f"| {c['cache_func']} | {c['rows']} | {c['keys']} |" for c in s["top_caches"]]
    lines += ["", "## Hottest keys", "", "| cache | key | invalidations |", "|---|---|---|"]
    lines += [f"| {k['cache_func']} | `{k['key']}` | {k['invalidations']} |" for k in s["top_keys"]]
    lines += ["", "## Reconciliation", ""]
    if not recon["workers"]:
        lines.append("No applied-range record: nothing to reconcile.")
    else:
        lines += [
            "| worker | writer | applied / published in span | missed | lag |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {w['worker_name']} | {w['instance_name']} | {w['applied_rows']} / {w['published_in_span']} | "
            f"{w['missed_rows']} | {w['lag_rows']} |"
            for w in recon["workers"]
        ]
    lines.append("")
    if recon["gaps"]:
        lines += [f"**GAPS: {recon['missed_rows']} published rows never applied.**", ""]
        lines += ["| worker | run | writer | stream ids | missed rows |", "|---|---|---|---|---|"]
        lines += [
            f"| {g['worker_name']} | {g['run_id']} | {g['instance_name']} | "
            f"({g['hole_from']}, {g['hole_to']}] "
            f"| {g['missed_rows']} ({g['first_missed_id']}..{g['last_missed_id']}) |"
            for g in recon["gaps"]
        ]
    else:
        lines.append("No gaps.")
    lines += ["", "## Charts", ""] + [f"![{p.stem}]({p.name})" for p in charts]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------------------------- session


def resolve_jdbc_jar(explicit: str | None) -> str:
    """The JDBC jar path: `explicit`, else $FANOUT_JDBC_JAR, else Debian's; AuditError if it is missing."""
    path = explicit or os.environ.get(JDBC_JAR_ENV) or DEFAULT_JDBC_JAR
    if not Path(path).is_file():
        raise AuditError(
            f"Postgres JDBC driver not found at {path}: apt-get install -y libpostgresql-jdbc-java, "
            f"or pass --jdbc-jar / set {JDBC_JAR_ENV}"
        )
    return path


def spark_session(
    master: str = "local[*]",
    jdbc_jar: str | None = None,
    conf: Sequence[tuple[str, str]] = (),
    app_name: str = "fanout-audit",
) -> tuple[SparkSession, bool]:
    """(session, owned): the active session if there is one (owned False: do not stop it), else a new one.

    The jar goes in `spark.jars` (a local file), so Spark never resolves anything from Ivy/Maven.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if jdbc_jar is not None:
        builder = builder.config("spark.jars", jdbc_jar)
    for key, value in conf:
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session, True


# ---------------------------------------------------------------------------------------------- CLI

_DURATION = re.compile(r"^(\d+)(ms|s|m|h)?$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_window(text: str) -> int:
    """'60s', '1m', '5m', '1h', '250ms' or bare milliseconds -> milliseconds (> 0)."""
    match = _DURATION.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"bad window {text!r}: want e.g. 60s, 1m, 5m, 1h")
    return int(match.group(1)) * _UNIT_MS[match.group(2) or "ms"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"want a positive integer, got {text!r}")
    return value


def _quantile(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"want a quantile in (0, 1), got {text!r}")
    return value


def conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"want KEY=VALUE, got {text!r}")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fanout audit",
        description="Invalidation audit on Spark. "
        "Exit 0: no gap; 1: a worker missed invalidations; 2: bad usage.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--database-url", default=os.environ.get("FANOUT_DATABASE_URL"),
                       help="postgresql://user@host:port/db (default $FANOUT_DATABASE_URL)")  # fmt: skip
        p.add_argument(
            "--jdbc-jar", help=f"Postgres JDBC jar (default ${JDBC_JAR_ENV} or {DEFAULT_JDBC_JAR})"
        )
        p.add_argument("--master", default="local[*]", help="any Spark master (default local[*])")
        p.add_argument("--num-partitions", type=_positive_int, help="JDBC read partitions on stream_id")
        p.add_argument("--lower-bound", type=int, help="JDBC partition lower bound (default: table min)")
        p.add_argument("--upper-bound", type=int, help="JDBC partition upper bound (default: table max)")
        p.add_argument("--spark-conf", type=conf_pair, action="append", default=[], metavar="KEY=VALUE")

    run = sub.add_parser("run", help="compute the audit (default)")
    common(run)
    run.add_argument("--parquet", type=Path, help="read a directory written by `fanout audit export` instead")
    run.add_argument(
        "--out", type=Path, default=Path("audit-report"), help="output directory (default ./audit-report)"
    )
    run.add_argument("--window", type=parse_window, default=60_000, help="window length (default 1m)")
    run.add_argument("--storm-threshold", type=float, help="rows per window above which it is a storm")
    run.add_argument("--storm-quantile", type=_quantile, default=0.99, help="used without --storm-threshold")
    run.add_argument("--top-n", type=_positive_int, default=10)
    run.add_argument(
        "--subscribers", type=int, help="workers subscribed to caches (default: from the record)"
    )

    exp = sub.add_parser("export", help="write the tables as Parquet for later runs")
    common(exp)
    exp.add_argument("--out", type=Path, required=True, help="output directory")
    return parser


def _postgres_source(args: argparse.Namespace) -> PostgresSource:
    if not args.database_url:
        raise AuditError("no source: pass --database-url (or set FANOUT_DATABASE_URL) or --parquet DIR")
    jdbc_url(args.database_url)
    return PostgresSource(
        database_url=args.database_url,
        jdbc_jar=resolve_jdbc_jar(args.jdbc_jar),
        num_partitions=args.num_partitions,
        lower_bound=args.lower_bound,
        upper_bound=args.upper_bound,
    )


def main(argv: list[str]) -> int:
    """`fanout audit [run|export] ...`; see `build_parser`. Exit 0 ok, 1 reconciliation gap, 2 bad usage."""
    argv = list(argv)
    if not argv or argv[0] not in ("run", "export", "-h", "--help"):
        argv = ["run", *argv]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed one usage message; return its status instead of exiting
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="audit: %(message)s")
    try:
        source: Source
        if args.command == "run" and args.parquet is not None:
            if not (args.parquet / "invalidations").is_dir():
                raise AuditError(
                    f"{args.parquet} has no invalidations/ (write it with `fanout audit export`)"
                )
            source = ParquetSource(args.parquet)
            jar = None
        else:
            source = _postgres_source(args)
            jar = source.jdbc_jar
        spark, owned = spark_session(args.master, jar, args.spark_conf)
        try:
            if args.command == "export":
                assert isinstance(source, PostgresSource)
                written = export(spark, source, args.out)
                print(json.dumps({"out": str(args.out), "rows": written}))
                return EXIT_OK
            options = AuditOptions(
                window_ms=args.window,
                storm_threshold=args.storm_threshold,
                storm_quantile=args.storm_quantile,
                top_n=args.top_n,
                subscribers=args.subscribers,
            )
            result = run_audit(spark, source, options)
            paths = write_outputs(result, args.out)
            release(result)
        finally:
            if owned:
                spark.stop()
    except AuditError as e:
        print(f"fanout audit: {e}", file=sys.stderr)
        return EXIT_USAGE
    recon = result.summary["reconciliation"]
    print(f"report: {paths.report}")
    print(f"summary: {paths.summary}")
    if not recon["ok"]:
        for gap in recon["gaps"]:
            print(
                f"GAP worker={gap['worker_name']} run={gap['run_id']} writer={gap['instance_name']} "
                f"stream_ids=({gap['hole_from']},{gap['hole_to']}] missed_rows={gap['missed_rows']}",
                file=sys.stderr,
            )
        return EXIT_GAP
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
