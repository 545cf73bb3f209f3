"""What the audit's figures are computed from: counts per window, per key and per writer's events,
and the published stream ids, read from raw rows or merged from an export's partial counts.

From PostgreSQL every figure comes from the raw rows. From Parquet each day comes from its partial
counts when `partials.split_days` allows it, else from its raw rows; both merge into the same
frames, so what follows (`job.run_audit`) does not know which was read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from analytics.figures import (
    annotate,
    dedupe,
    events_per_window,
    key_counts,
    merge_events_per_window,
    merge_window_counts,
    window_counts,
)
from analytics.locations import join
from analytics.partials import (
    EVENT_PARTIALS,
    INVALIDATION_PARTIALS,
    key_partials,
    read_days,
    split_days,
    window_partials,
)
from analytics.schema import (
    EVENT_PARTIALS_SCHEMA,
    EVENTS_SCHEMA,
    INVALIDATION_PARTIALS_SCHEMA,
    INVALIDATIONS_SCHEMA,
)
from analytics.sources import ParquetSource, Source, load_events, load_invalidations


@dataclass(frozen=True)
class AuditInputs:
    """The frames every figure is computed from, and where each came from.

    `annotated`: the raw rows read (deduplicated, annotated for the audit's window, persisted);
    `counts`: `figures.window_counts` for the audit's window; `keys`: `figures.key_counts` rows,
    possibly several per key (sum them); `published`: (stream_id, instance_name), each id once;
    `events_by_window`: events per window and writer; `read`: which days came from partial counts
    and which from raw rows, and why (the summary's `read`)."""

    annotated: DataFrame
    counts: DataFrame
    keys: DataFrame
    published: DataFrame
    events_by_window: DataFrame
    read: dict[str, Any]

    def release(self) -> None:
        self.annotated.unpersist()


def load_inputs(spark: SparkSession, source: Source, window_ms: int) -> AuditInputs:
    """The audit's inputs from `source` (see the module docstring)."""
    if not isinstance(source, ParquetSource):
        annotated = annotate(dedupe(load_invalidations(spark, source)), window_ms)
        annotated = annotated.persist(StorageLevel.MEMORY_AND_DISK)
        return AuditInputs(
            annotated,
            window_counts(annotated),
            key_counts(annotated),
            annotated.select("stream_id", "instance_name"),
            events_per_window(load_events(spark, source), window_ms),
            {"source": "postgres"},
        )
    location = source.location
    invalidations = split_days(spark, location, "invalidations", window_ms)
    events = split_days(spark, location, "events", window_ms)
    raw_location = join(location, "invalidations")
    raw = read_days(spark, raw_location, invalidations.from_rows, INVALIDATIONS_SCHEMA)
    annotated = annotate(dedupe(raw), window_ms).persist(StorageLevel.MEMORY_AND_DISK)
    partials_location = join(location, INVALIDATION_PARTIALS)
    partials = read_days(spark, partials_location, invalidations.from_partials, INVALIDATION_PARTIALS_SCHEMA)
    ids = read_days(spark, raw_location, invalidations.from_partials, INVALIDATIONS_SCHEMA)
    from_rows, from_partials = bool(invalidations.from_rows), bool(invalidations.from_partials)
    event_rows = read_days(spark, join(location, "events"), events.from_rows, EVENTS_SCHEMA)
    event_partials = read_days(
        spark, join(location, EVENT_PARTIALS), events.from_partials, EVENT_PARTIALS_SCHEMA
    ).drop("window_ms")
    return AuditInputs(
        annotated,
        merge_window_counts(
            _union(window_counts(annotated), from_rows, window_partials(partials), from_partials), window_ms
        ),
        _union(key_counts(annotated), from_rows, key_partials(partials), from_partials),
        _union(
            annotated.select("stream_id", "instance_name"),
            from_rows,
            ids.select("stream_id", "instance_name").dropDuplicates(["stream_id"]),
            from_partials,
        ),
        merge_events_per_window(
            _union(
                events_per_window(event_rows, window_ms),
                bool(events.from_rows),
                event_partials,
                bool(events.from_partials),
            ),
            window_ms,
        ),
        {"source": "parquet", "invalidations": invalidations.as_dict(), "events": events.as_dict()},
    )


def _union(from_rows: DataFrame, any_rows: bool, from_partials: DataFrame, any_partials: bool) -> DataFrame:
    """The part read from raw rows beside the part from partial counts; only the one that holds
    days when the other holds none (so that a plan never carries an empty branch)."""
    if any_rows and not any_partials:
        return from_rows
    if any_partials and not any_rows:
        return from_partials
    return from_rows.unionByName(from_partials)


def describe(read: dict[str, Any]) -> str:
    """One line: what the audit read, for the log and the report."""
    if read.get("source") != "parquet":
        return "raw rows from PostgreSQL"
    parts = []
    for table in ("invalidations", "events"):
        split = read[table]
        text = (
            f"{table}: partial counts for {len(split['from_partials'])} day(s),"
            f" raw rows for {len(split['from_rows'])}"
        )
        parts.append(f"{text} ({split['why']})" if split["why"] else text)
    return "; ".join(parts)
