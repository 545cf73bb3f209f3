"""What the audit's figures are computed from: counts per window, per key and per writer's events,
and the published stream ids, read from raw rows or merged from an export's partial counts.

From PostgreSQL every figure comes from the raw rows. From Parquet each day comes from its partial
counts when `partials.split_days` allows it, else from its raw rows; both merge into the same
frames, so what follows (`job.run_audit`) does not know which was read.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

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


class AuditInputs:
    """The frames every figure is computed from, and where each came from; each frame is built when
    first asked for (a plan costs a round trip to the JVM per step: the benchmark asks for `counts`
    alone, and a day read from partial counts never builds the raw-row branch).

    `annotated`: the raw rows read (deduplicated, annotated for the audit's window, persisted), None
    when every day comes from partial counts; `counts`: `figures.window_counts` for the audit's
    window; `keys`: `figures.key_counts` rows, possibly several per key (sum them); `published`:
    (stream_id, instance_name), each id once; `events_by_window`: events per window and writer;
    `read`: which days came from partial counts and which from raw rows, and why (the summary's
    `read`)."""

    def __init__(self, spark: SparkSession, source: Source, window_ms: int) -> None:
        self._spark, self._source, self._window_ms = spark, source, window_ms
        if isinstance(source, ParquetSource):
            self._invalidations = split_days(spark, source.location, "invalidations", window_ms)
            self._events = split_days(spark, source.location, "events", window_ms)
            self.read: dict[str, Any] = {
                "source": "parquet",
                "invalidations": self._invalidations.as_dict(),
                "events": self._events.as_dict(),
            }
        else:
            self.read = {"source": "postgres"}

    def _days(self, table: str, days: tuple[str, ...], schema: StructType) -> DataFrame:
        assert isinstance(self._source, ParquetSource)
        return read_days(self._spark, join(self._source.location, table), days, schema)

    @cached_property
    def annotated(self) -> DataFrame | None:
        if isinstance(self._source, ParquetSource):
            if not self._invalidations.from_rows and self._invalidations.from_partials:
                return None
            raw = self._days("invalidations", self._invalidations.from_rows, INVALIDATIONS_SCHEMA)
        else:
            raw = load_invalidations(self._spark, self._source)
        return annotate(dedupe(raw), self._window_ms).persist(StorageLevel.MEMORY_AND_DISK)

    @cached_property
    def _partials(self) -> DataFrame | None:
        if not isinstance(self._source, ParquetSource) or not self._invalidations.from_partials:
            return None
        days = self._invalidations.from_partials
        return self._days(INVALIDATION_PARTIALS, days, INVALIDATION_PARTIALS_SCHEMA)

    @cached_property
    def counts(self) -> DataFrame:
        rows = None if self.annotated is None else window_counts(self.annotated)
        if self._partials is None:
            assert rows is not None
            return rows
        merged = _union(rows, window_partials(self._partials))
        return merge_window_counts(merged, self._window_ms)

    @cached_property
    def keys(self) -> DataFrame:
        rows = None if self.annotated is None else key_counts(self.annotated)
        return _union(rows, None if self._partials is None else key_partials(self._partials))

    @cached_property
    def published(self) -> DataFrame:
        rows = None if self.annotated is None else self.annotated.select("stream_id", "instance_name")
        if self._partials is None:
            assert rows is not None
            return rows
        ids = self._days("invalidations", self._invalidations.from_partials, INVALIDATIONS_SCHEMA)
        return _union(rows, ids.select("stream_id", "instance_name").dropDuplicates(["stream_id"]))

    @cached_property
    def events_by_window(self) -> DataFrame:
        if not isinstance(self._source, ParquetSource):
            return events_per_window(load_events(self._spark, self._source), self._window_ms)
        rows = partials = None
        if self._events.from_rows or not self._events.from_partials:
            rows = events_per_window(
                self._days("events", self._events.from_rows, EVENTS_SCHEMA), self._window_ms
            )
        if self._events.from_partials:
            days = self._events.from_partials
            partials = self._days(EVENT_PARTIALS, days, EVENT_PARTIALS_SCHEMA).drop("window_ms")
        return merge_events_per_window(_union(rows, partials), self._window_ms)

    def release(self) -> None:
        if self.__dict__.get("annotated") is not None:
            self.__dict__["annotated"].unpersist()


def load_inputs(spark: SparkSession, source: Source, window_ms: int) -> AuditInputs:
    """The audit's inputs from `source` (see the module docstring): which days come from where is
    decided here; the frames are built when asked for."""
    return AuditInputs(spark, source, window_ms)


def _union(from_rows: DataFrame | None, from_partials: DataFrame | None) -> DataFrame:
    """The part read from raw rows beside the part from partial counts (at least one is given)."""
    if from_rows is None or from_partials is None:
        either = from_rows if from_rows is not None else from_partials
        assert either is not None
        return either
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
