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
