"""Storms: windows whose invalidation rows exceed a threshold, configured or a quantile of the windows."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F


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
