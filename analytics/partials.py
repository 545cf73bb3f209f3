"""Partial counts: what `export` writes beside the raw rows so that the audit reads far fewer rows,
and the rule that decides, day by day, whether the audit may use them.

Per UTC day, `invalidation_partials/` holds the counts of every 1-minute window, cache and writer
(`figures.window_counts` of that day's rows, grain "window") and the rows that invalidate each cache
and key (`figures.key_counts`, grain "key"); `event_partials/` the events per 1-minute window and
writer. Every figure of the audit except reconciliation is a sum, minimum or maximum of these, so for
a window that is a whole number of minutes (minute windows nest in it, and in days) merging them
gives exactly what the raw rows give. Reconciliation needs the stream ids: it still reads those two
columns of the raw rows.

A day's partials are used only when they were computed from exactly the raw files that day holds
now: after writing both, `export` leaves in the partials' day directory a manifest (`_manifest.json`,
a name Spark's reader skips) naming the day's raw files and partial files with their sizes. Spark
names every file it writes afresh: a re-export of the day replaces both and writes a new manifest,
`--after-restore` drops both with the day, and an export that failed between the two writes leaves
a manifest that no longer matches. Such a day, and one exported before partials existed, is read
from its raw rows instead, and `DaySplit.why` says so. The check is a file listing on the driver:
no Spark job, no row read.

Copies of a stream id are one row seen twice (docs/audit.md), so they share a timestamp and a day;
the partials count each id once per day.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from analytics.figures import (
    COUNT_KEYS,
    annotate,
    dedupe,
    events_per_window,
    key_counts,
    window_counts,
)
from analytics.locations import files_by_partition, join, read_text, write_text
from analytics.schema import EVENT_PARTIALS_SCHEMA, INVALIDATION_PARTIALS_SCHEMA, SUMMED_COUNTS

PARTIAL_WINDOW_MS = 60_000
INVALIDATION_PARTIALS = "invalidation_partials"
EVENT_PARTIALS = "event_partials"
PARTIALS_OF = {"invalidations": INVALIDATION_PARTIALS, "events": EVENT_PARTIALS}
MANIFEST = "_manifest.json"


def day_of(ms: Column) -> Column:
    """The UTC day (`YYYY-MM-DD`) of an epoch-milliseconds column: the export's partition."""
    return F.date_format(F.timestamp_millis(ms), "yyyy-MM-dd")


def write_days(frame: DataFrame, location: str) -> None:
    """Write `frame` partitioned by `day`, replacing the days it holds and keeping the others."""
    frame.write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy("day").parquet(
        location
    )


def _typed(frame: DataFrame, schema: StructType, values: dict[str, Column]) -> DataFrame:
    """`frame` as `schema`'s columns plus `day`: a column from `values`, else `frame`'s, else NULL."""
    columns = [
        (values[f.name] if f.name in values else F.col(f.name) if f.name in frame.columns else F.lit(None))
        .cast(f.dataType)
        .alias(f.name)
        for f in schema.fields
    ]
    return frame.select(*columns, "day")


def write_invalidation_partials(invalidations: DataFrame, location: str) -> tuple[int, list[str]]:
    """Write the partial counts of `invalidations` (raw rows with their `day`) at `location`,
    replacing the days they hold; returns the partial rows written and their days."""
    annotated = annotate(dedupe(invalidations, within=("day",)), PARTIAL_WINDOW_MS).persist()
    try:
        windows = window_counts(annotated).withColumn("day", day_of(F.col("window_start")))
        keys = key_counts(annotated.withColumn("day", day_of(F.col("window_start"))), by=("day",))
        base = {"window_ms": F.lit(PARTIAL_WINDOW_MS)}
        partials = _typed(windows, INVALIDATION_PARTIALS_SCHEMA, {**base, "grain": F.lit("window")})
        key_values = {**base, "grain": F.lit("key"), "rows": F.col("invalidations")}
        partials = partials.unionByName(_typed(keys, INVALIDATION_PARTIALS_SCHEMA, key_values))
        return _write_partials(partials, location)
    finally:
        annotated.unpersist()


def write_event_partials(events: DataFrame, location: str) -> tuple[int, list[str]]:
    """Write the events per 1-minute window and writer of `events` (with their `day`) at `location`,
    replacing the days they hold; returns the partial rows written and their days."""
    counts = events_per_window(events, PARTIAL_WINDOW_MS).withColumn("day", day_of(F.col("window_start")))
    partials = _typed(counts, EVENT_PARTIALS_SCHEMA, {"window_ms": F.lit(PARTIAL_WINDOW_MS)})
    return _write_partials(partials, location)


def _write_partials(partials: DataFrame, location: str) -> tuple[int, list[str]]:
    # One file per day: the audit then reads each day's partial counts in one task.
    partials = partials.repartition("day").persist()
    try:
        written = partials.count()
        days = sorted(str(r["day"]) for r in partials.select("day").distinct().collect())
        write_days(partials, location)
        return written, days
    finally:
        partials.unpersist()


def write_manifests(spark: SparkSession, location: str, table: str, days: list[str]) -> None:
    """After `table`'s raw rows and partial counts for `days` are written under `location`: the
    manifest of each of those days (see the module docstring). Only these days: a manifest must
    never vouch for partials this export did not write."""
    partials_location = join(location, PARTIALS_OF[table])
    raw = files_by_partition(spark, join(location, table))
    partial = files_by_partition(spark, partials_location)
    for day in days:
        part = f"day={day}"
        manifest = _manifest(raw.get(part, []), partial.get(part, []), PARTIAL_WINDOW_MS)
        write_text(spark, join(join(partials_location, part), MANIFEST), json.dumps(manifest, sort_keys=True))


def _manifest(raw: list[list[Any]], partial: list[list[Any]], window_ms: int) -> dict[str, Any]:
    return {
        "window_ms": window_ms,
        "rows": raw,
        "partials": [f for f in partial if not str(f[0]).startswith("_")],
    }


@dataclass(frozen=True)
class DaySplit:
    """The days of one exported table the audit reads from partial counts and those it reads from
    raw rows, and why any is read from raw rows ("" when none is)."""

    from_partials: tuple[str, ...] = ()
    from_rows: tuple[str, ...] = ()
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"from_partials": list(self.from_partials), "from_rows": list(self.from_rows), "why": self.why}


def _days(days: list[str]) -> str:
    return ", ".join(days) if len(days) <= 3 else f"{days[0]} .. {days[-1]}"


def split_days(spark: SparkSession, location: str, table: str, window_ms: int) -> DaySplit:
    """Which days of `table` ("invalidations" or "events") under `location` have partial counts made
    from exactly their raw files, in windows that nest in `window_ms` (see the module docstring)."""
    partials_location = join(location, PARTIALS_OF[table])
    raw = files_by_partition(spark, join(location, table))
    partial = files_by_partition(spark, partials_location)
    usable: list[str] = []
    missing: list[str] = []
    stale: list[str] = []
    coarse: list[str] = []
    for part in sorted(raw):
        day = part.partition("=")[2]
        files = partial.get(part, [])
        if not any(name == MANIFEST for name, _ in files):
            missing.append(day)
            continue
        try:
            manifest = json.loads(read_text(spark, join(join(partials_location, part), MANIFEST)))
            base = int(manifest["window_ms"])
        except (ValueError, KeyError, TypeError):  # unreadable: as good as stale
            manifest, base = None, 0
        if base <= 0 or manifest != _manifest(raw[part], files, base):
            stale.append(day)
        elif window_ms % base != 0:
            coarse.append(day)
        else:
            usable.append(day)
    why = []
    if missing:
        why.append(f"no partial counts for {len(missing)} day(s) ({_days(missing)}: exported without them)")
    if stale:
        why.append(f"partial counts that do not match the rows for {len(stale)} day(s) ({_days(stale)})")
    if coarse:
        why.append(f"window {window_ms} ms is not a whole number of the partials' windows ({_days(coarse)})")
    return DaySplit(tuple(usable), tuple(sorted(missing + stale + coarse)), "; ".join(why))


def read_days(spark: SparkSession, location: str, days: tuple[str, ...], schema: StructType) -> DataFrame:
    """`schema`'s columns of the given day partitions under `location` (empty when `days` is)."""
    if not days:
        return spark.createDataFrame([], schema)
    paths = [join(location, f"day={day}") for day in days]
    return spark.read.schema(schema).parquet(*paths).select(*schema.fieldNames())


def window_partials(partials: DataFrame) -> DataFrame:
    """The "window" rows of `invalidation_partials` as `figures.window_counts` rows."""
    return partials.where(F.col("grain") == "window").select(
        *COUNT_KEYS, *SUMMED_COUNTS, "first_stream_id", "last_stream_id"
    )


def key_partials(partials: DataFrame) -> DataFrame:
    """The "key" rows of `invalidation_partials` as `figures.key_counts` rows."""
    return partials.where(F.col("grain") == "key").select(
        "cache_func", "key", F.col("rows").alias("invalidations")
    )
