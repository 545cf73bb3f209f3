"""The figures: per-row facts, per-window volumes, savings from batching, the hottest caches and keys.

Each function takes and returns DataFrames (definitions in docs/audit.md); only aggregates are
ever collected, by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from analytics.schema import BATCHED_CACHE_SUFFIX, INVALIDATIONS_SCHEMA, SUMMED_COUNTS


def dedupe(invalidations: DataFrame, within: Sequence[str] = ()) -> DataFrame:
    """One row per stream_id (per stream_id and `within` columns, kept), plus `copies` (how often it
    was seen). Which copy survives is unspecified."""
    others = [c for c in INVALIDATIONS_SCHEMA.fieldNames() if c != "stream_id"]
    return (
        invalidations.groupBy(*within, "stream_id")
        .agg(F.first(F.struct(*others)).alias("row"), F.count(F.lit(1)).alias("copies"))
        .select(*within, "stream_id", *[F.col(f"row.{c}").alias(c) for c in others], "copies")
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
        .when(batched_cache, F.size(F.array_distinct("keys")))
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


COUNT_KEYS = ("window_start", "cache_func", "instance_name")


def window_counts(annotated: DataFrame) -> DataFrame:
    """One row per (window_start, cache_func, instance_name): the volumes every window figure sums
    (`SUMMED_COUNTS`) and the first and last stream id. Merged exactly by `merge_window_counts`."""

    def kind(name: str) -> Column:
        return F.sum(F.when(F.col("kind") == name, 1).otherwise(0)).cast("long")

    return annotated.groupBy(*COUNT_KEYS).agg(
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


def merge_window_counts(counts: DataFrame, window_ms: int) -> DataFrame:
    """`window_counts` rows (of finer windows that nest in `window_ms`, or of several sources) as the
    counts of `window_ms` windows: sums of the additive columns, min and max of the stream ids. Exact
    whenever no row was counted twice (each input window lies inside one output window)."""
    return (
        counts.withColumn("window_start", window_start(F.col("window_start"), window_ms))
        .groupBy(*COUNT_KEYS)
        .agg(
            *[F.sum(c).cast("long").alias(c) for c in SUMMED_COUNTS],
            F.min("first_stream_id").alias("first_stream_id"),
            F.max("last_stream_id").alias("last_stream_id"),
        )
    )


def stats_from_counts(counts: DataFrame, subscribers: int) -> DataFrame:
    """`window_counts` plus what follows from them: saved messages and the fan-out to `subscribers`."""
    return (
        counts.withColumn("saved_messages", F.col("per_key_messages") - F.col("rows"))
        .withColumn("fanout_messages", F.col("rows") * F.lit(subscribers))
        .withColumn("per_key_fanout_messages", F.col("per_key_messages") * F.lit(subscribers))
    )


def window_stats(annotated: DataFrame, subscribers: int) -> DataFrame:
    """One row per (window_start, cache_func, instance_name): volumes, kinds, bytes, savings, fan-out."""
    return stats_from_counts(window_counts(annotated), subscribers)


def events_per_window(events: DataFrame, window_ms: int) -> DataFrame:
    """(window_start, instance_name, events): events persisted per writer and window."""
    return (
        events.withColumn("window_start", window_start(F.col("received_ts"), window_ms))
        .groupBy("window_start", "instance_name")
        .agg(F.count(F.lit(1)).alias("events"))
    )


def merge_events_per_window(counts: DataFrame, window_ms: int) -> DataFrame:
    """`events_per_window` rows of finer windows (nesting in `window_ms`) as those of `window_ms`."""
    return (
        counts.withColumn("window_start", window_start(F.col("window_start"), window_ms))
        .groupBy("window_start", "instance_name")
        .agg(F.sum("events").cast("long").alias("events"))
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


TOTAL_COLUMNS = (*SUMMED_COUNTS, "saved_messages", "fanout_messages", "per_key_fanout_messages")


def window_totals(stats: DataFrame, events_by_window: DataFrame, window_ms: int) -> DataFrame:
    """One row per window from the first to the last one seen, empty windows included with zeros."""
    bounds = stats.agg(F.min("window_start").alias("lo"), F.max("window_start").alias("hi")).first()
    spark = stats.sparkSession
    if bounds is None or bounds["lo"] is None:
        schema = T.StructType(
            [T.StructField("window_start", T.LongType())]
            + [T.StructField(c, T.LongType()) for c in (*TOTAL_COLUMNS, "events")]
            + [T.StructField("amplification", T.DoubleType())]
        )
        return spark.createDataFrame([], schema)
    all_windows = spark.range(bounds["lo"], bounds["hi"] + window_ms, window_ms).select(
        F.col("id").alias("window_start")
    )
    sums = stats.groupBy("window_start").agg(*[F.sum(c).alias(c) for c in TOTAL_COLUMNS])
    events = events_by_window.groupBy("window_start").agg(F.sum("events").alias("events"))
    filled = all_windows.join(sums, "window_start", "left").join(events, "window_start", "left")
    return filled.select(
        "window_start",
        *[F.coalesce(F.col(c), F.lit(0)).cast("long").alias(c) for c in (*TOTAL_COLUMNS, "events")],
    ).withColumn("amplification", _ratio(F.col("rows"), F.col("events")))


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


def key_counts(annotated: DataFrame, by: Sequence[str] = ()) -> DataFrame:
    """(`by` columns, cache_func, key, invalidations): the rows that invalidate each key. A key counts
    once per row that invalidates it, however often the row lists it; keys NULL names no key."""
    batched = F.col("cache_func").endswith(BATCHED_CACHE_SUFFIX)
    tuple_key = F.when(F.size("keys") == 1, F.col("keys")[0]).otherwise(F.to_json(F.col("keys")))
    keys = F.when(batched, F.array_distinct(F.col("keys"))).otherwise(F.array(tuple_key))
    return (
        annotated.where(F.col("keys").isNotNull())
        .select(*by, "cache_func", F.explode(keys).alias("key"))
        .groupBy(*by, "cache_func", "key")
        .agg(F.count(F.lit(1)).alias("invalidations"))
    )


def top_key_counts(counts: DataFrame, n: int) -> DataFrame:
    """The `n` (cache, key) pairs with the most invalidations in `counts` (`key_counts` rows, possibly
    several per pair: they are summed first), ties by cache, then key."""
    return (
        counts.groupBy("cache_func", "key")
        .agg(F.sum("invalidations").cast("long").alias("invalidations"))
        .orderBy(F.desc("invalidations"), F.asc("cache_func"), F.asc("key"))
        .limit(n)
    )


def top_keys(annotated: DataFrame, n: int) -> DataFrame:
    """The `n` (cache, key) pairs invalidated by the most rows (ties by cache, then key)."""
    return top_key_counts(key_counts(annotated), n)
