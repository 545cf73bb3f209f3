"""Reconciliation: what each worker recorded as applied against what the writers published.

Why this record. A sync worker must persist what it applied; the cheapest record that is honest
is the table `replication_applied_ranges` (migration 0002, whose header is the contract): one row
per contiguously applied range `(from_id, to_id]` per worker, process run, stream and writer,
extended in place while the worker applies in order and started anew only when it skips. A
persisted position alone cannot show a hole in the middle, and counting applied rows would cost a
write per row and still not say which rows. With ranges, published rows of a writer inside a run's
span but outside every range of that run are exactly the missed invalidations (gaps); rows between
two runs are not gaps (a new process starts with empty caches); rows after the last range are lag.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from analytics.schema import CACHES_STREAM


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
