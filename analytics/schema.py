"""The tables the audit reads, their Spark schemas, and the names it shares with the worker.

Nothing here runs anything; every other module of the package imports its names from here.
"""

from __future__ import annotations

from pyspark.sql import types as T

CACHES_STREAM = "caches"
BATCHED_CACHE_SUFFIX = "_cache_fake"
INVALIDATIONS_TABLE = "cache_invalidation_stream_by_instance"
EVENTS_TABLE = "events"
APPLIED_TABLE = "replication_applied_ranges"

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

#: The additive counts of a window, cache and writer (`figures.window_counts`): summed when the counts
#: of finer windows or of several days merge.
SUMMED_COUNTS = (
    "rows",
    "keys",
    "batched_rows",
    "single_key_rows",
    "invalidate_all_rows",
    "bytes",
    "per_key_messages",
    "duplicate_copies",
)

#: What `export` writes beside the raw rows (analytics/partials.py): per UTC day, the counts of each
#: base window, cache and writer (grain "window") and of each cache and key (grain "key"; `rows` is
#: then the rows that invalidate the key and the other counts are NULL).
INVALIDATION_PARTIALS_SCHEMA = T.StructType(
    [
        T.StructField("grain", T.StringType()),
        T.StructField("window_ms", T.LongType()),
        T.StructField("window_start", T.LongType()),
        T.StructField("cache_func", T.StringType()),
        T.StructField("instance_name", T.StringType()),
        T.StructField("key", T.StringType()),
        *[T.StructField(c, T.LongType()) for c in (*SUMMED_COUNTS, "first_stream_id", "last_stream_id")],
    ]
)

EVENT_PARTIALS_SCHEMA = T.StructType(
    [
        T.StructField("window_ms", T.LongType()),
        T.StructField("window_start", T.LongType()),
        T.StructField("instance_name", T.StringType()),
        T.StructField("events", T.LongType()),
    ]
)
