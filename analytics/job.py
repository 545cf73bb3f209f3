"""The audit as one job: load, deduplicate, aggregate, find storms, reconcile, summarise.

`run_audit` returns the output tables (persisted DataFrames) and a small JSON-ready summary;
`release` unpersists them. The CLI, the notebook and the benchmark all call this.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics.figures import (
    TOTAL_COLUMNS,
    savings_by_cache,
    stats_from_counts,
    top_caches,
    top_key_counts,
    window_totals,
    with_amplification,
)
from analytics.inputs import describe, load_inputs
from analytics.reconcile import reconcile
from analytics.schema import CACHES_STREAM
from analytics.sources import Source, load_applied_ranges
from analytics.storms import StormThreshold, storm_threshold, storms

log = logging.getLogger("analytics.audit")


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
    """Load (raw rows, or an export's partial counts where they hold: `inputs.py`), aggregate and
    reconcile. The tables are persisted; call `release` when done."""
    started = time.monotonic()
    log.info("step=load source=%s", type(source).__name__)
    inputs = load_inputs(spark, source, options.window_ms)
    log.info("step=load read=%s", describe(inputs.read))
    applied = load_applied_ranges(spark, source).persist(StorageLevel.MEMORY_AND_DISK)
    if options.subscribers is not None:
        subscribers, subscribers_source = options.subscribers, "configured"
    else:
        subscribers = (
            applied.where(F.col("stream_name") == CACHES_STREAM).select("worker_name").distinct().count()
        )
        subscribers_source = "applied_record"
    events_by_window = inputs.events_by_window.persist()
    log.info("step=aggregate window_ms=%d subscribers=%d", options.window_ms, subscribers)
    stats = with_amplification(stats_from_counts(inputs.counts, subscribers), events_by_window).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    totals = window_totals(stats, events_by_window, options.window_ms).persist()
    threshold = storm_threshold(totals, options.storm_threshold, options.storm_quantile)
    log.info("step=reconcile")
    per_worker, gaps = reconcile(inputs.published, applied)
    tables = {
        "window_stats": stats,
        "window_totals": totals,
        "storms": storms(totals, stats, threshold),
        "savings_by_cache": savings_by_cache(stats),
        "top_caches": top_caches(stats, options.top_n),
        "top_keys": top_key_counts(inputs.keys, options.top_n),
        "reconciliation": per_worker.persist(),
        "gaps": gaps.persist(),
        **({"_annotated": inputs.annotated} if inputs.annotated is not None else {}),
        "_applied": applied,
        "_events_by_window": events_by_window,
    }
    log.info("step=summarize")
    summary = _summarize(tables, options, threshold, subscribers, subscribers_source)
    summary["read"] = {**inputs.read, "description": describe(inputs.read)}
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
            *[F.sum(c).alias(c) for c in (*TOTAL_COLUMNS, "events")],
            F.count(F.lit(1)).alias("windows"),
            F.min("window_start").alias("first_window_start"),
            F.max("window_start").alias("last_window_start"),
        )
        .first()
    )
    # A sum over no window is 0; the first and last window of an empty log do not exist (None).
    totals = {
        k: (0 if v is None and not k.endswith("_window_start") else v)
        for k, v in (totals_row.asDict() if totals_row else {}).items()
    }
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
