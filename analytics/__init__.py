"""The invalidation audit: a PySpark job over the `caches` stream's log, its figures and its report.

| module | holds |
|---|---|
| `schema.py` | the tables read and their Spark schemas |
| `session.py` | the Spark session and the JDBC driver |
| `sources.py` | reading Postgres over JDBC or Parquet exports; `export` |
| `figures.py` | per-row facts, window volumes, savings from batching, hottest caches and keys |
| `partials.py` | the partial counts an export writes beside the raw rows, and when a day may use them |
| `inputs.py` | what the figures are computed from: raw rows, or partial counts merged exactly |
| `storms.py` | windows above a threshold |
| `reconcile.py` | what each worker applied against what was published (gaps, lag) |
| `job.py` | `run_audit`: all of the above as one job, with a JSON-ready summary |
| `report.py` | Parquet tables, `summary.json`, charts and `report.md` |
| `cli.py` | `fanout audit` / `python -m analytics`; `audit.py` is the spark-submit entry |
| `generate.py` | synthetic logs with counts known in closed form (tests, benchmark, notebook) |
| `bundle.py` | the zip spark-submit ships (`make audit-zip`, the audit image) |

The definitions of every figure are in docs/audit.md. The package needs pyspark (matplotlib for
the charts) and never imports `workers`, `pubsub` or `idgen`: under spark-submit it is shipped alone
(`--py-files dist/analytics.zip`, built by `make audit-zip`).

The others:

* `__main__.py`: `python -m analytics ...` is `fanout audit ...`
* `errors.py`: The audit's errors: what the user must fix or check, said in one line, each with its
  exit code
* `locations.py`: Where the audit reads and writes: a local path or any URI Spark knows (`file://`,
  `hdfs://`, `s3a://`)
"""

from __future__ import annotations

from analytics.cli import conf_pair, main, parse_window
from analytics.errors import AuditError
from analytics.figures import (
    annotate,
    dedupe,
    events_per_window,
    key_counts,
    merge_events_per_window,
    merge_window_counts,
    savings_by_cache,
    stats_from_counts,
    top_caches,
    top_key_counts,
    top_keys,
    window_counts,
    window_stats,
    window_totals,
    with_amplification,
)
from analytics.inputs import AuditInputs, load_inputs
from analytics.job import AuditOptions, AuditResult, release, run_audit
from analytics.reconcile import applied_holes, reconcile
from analytics.report import OutputPaths, render_report, write_outputs
from analytics.schema import APPLIED_SCHEMA, EVENTS_SCHEMA, INVALIDATIONS_SCHEMA
from analytics.session import resolve_jdbc_jar, spark_session
from analytics.sources import (
    ParquetSource,
    PostgresSource,
    export,
    jdbc_url,
    load_applied_ranges,
    load_events,
    load_invalidations,
)
from analytics.storms import StormThreshold, storm_threshold, storms

__all__ = [
    "APPLIED_SCHEMA",
    "EVENTS_SCHEMA",
    "INVALIDATIONS_SCHEMA",
    "AuditError",
    "AuditInputs",
    "AuditOptions",
    "AuditResult",
    "OutputPaths",
    "ParquetSource",
    "PostgresSource",
    "StormThreshold",
    "annotate",
    "applied_holes",
    "conf_pair",
    "dedupe",
    "events_per_window",
    "export",
    "jdbc_url",
    "key_counts",
    "load_applied_ranges",
    "load_events",
    "load_inputs",
    "load_invalidations",
    "main",
    "merge_events_per_window",
    "merge_window_counts",
    "parse_window",
    "reconcile",
    "release",
    "render_report",
    "resolve_jdbc_jar",
    "run_audit",
    "savings_by_cache",
    "spark_session",
    "stats_from_counts",
    "storm_threshold",
    "storms",
    "top_caches",
    "top_key_counts",
    "top_keys",
    "window_counts",
    "window_stats",
    "window_totals",
    "with_amplification",
    "write_outputs",
]
