"""The audit's outputs: a Parquet directory per table, `summary.json`, PNG charts and `report.md`."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analytics.job import AuditResult
from analytics.locations import copy_files, join, local_path

log = logging.getLogger("analytics.audit")


@dataclass(frozen=True)
class OutputPaths:
    """Where `write_outputs` put things (paths or URIs, as the output location was given)."""

    out: str
    tables: dict[str, str]
    summary: str
    charts: list[str]
    report: str


def write_outputs(result: AuditResult, out: str) -> OutputPaths:
    """Parquet per table, `summary.json`, PNG charts and `report.md` at `out` (a path or any URI
    Spark writes to; overwritten)."""
    spark = next(iter(result.tables.values())).sparkSession
    tables: dict[str, str] = {}
    for name, frame in result.tables.items():
        if name.startswith("_"):
            continue
        tables[name] = join(out, name)
        log.info("step=write table=%s", name)
        frame.write.mode("overwrite").parquet(tables[name])
    local = local_path(out)
    with tempfile.TemporaryDirectory(prefix="fanout-audit-") as scratch:
        folder = local if local is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        summary = folder / "summary.json"
        summary.write_text(json.dumps(result.summary, indent=2, sort_keys=True, default=str) + "\n")
        charts = render_charts(result, folder)
        report = render_report(result, charts, folder)
        files = [summary, *charts, report]
        placed = [str(f) for f in files] if local is not None else copy_files(spark, files, out)
    if local is None:
        return OutputPaths(out, tables, placed[0], placed[1:-1], placed[-1])
    return OutputPaths(out, tables, join(out, "summary.json"), [join(out, c.name) for c in charts],
                       join(out, "report.md"))  # fmt: skip


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def render_charts(result: AuditResult, out_dir: Path) -> list[Path]:
    """Rows per window (with the storm threshold), top caches, and batching savings per cache.

    Figures are made with matplotlib's object API, never pyplot: no backend is chosen or changed,
    so a notebook that calls this keeps its own inline plots."""
    from matplotlib.figure import Figure

    summary, series = result.summary, result.window_series
    paths: list[Path] = []

    fig = Figure(figsize=(10, 4))
    ax = fig.subplots()
    xs = [(w["window_start"] - series[0]["window_start"]) / 60_000 for w in series] if series else []
    ax.plot(xs, [w["rows"] for w in series], label="rows sent")
    ax.plot(xs, [w["per_key_messages"] for w in series], label="per-key messages", alpha=0.6)
    ax.axhline(summary["storm_threshold"]["rows"], color="red", linestyle="--", label="storm threshold")
    storm_starts = {s["window_start"] for s in summary["storms"]}
    storm_points = [
        (x, w["rows"]) for x, w in zip(xs, series, strict=True) if w["window_start"] in storm_starts
    ]
    if storm_points:
        ax.scatter(*zip(*storm_points, strict=True), color="red", zorder=3, label="storm")
    start = _utc(series[0]["window_start"]) if series else "-"
    ax.set(xlabel=f"minutes since {start} UTC", ylabel="per window", title="Invalidations per window")
    ax.legend()
    paths.append(_save(fig, out_dir / "rows_per_window.png"))

    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    caches = list(reversed(summary["top_caches"]))
    ax.barh([c["cache_func"] for c in caches], [c["rows"] for c in caches])
    ax.set(xlabel="rows", title="Hottest caches")
    paths.append(_save(fig, out_dir / "top_caches.png"))

    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    savings = summary["savings_by_cache"][: max(1, len(summary["top_caches"]))]
    names = [s["cache_func"] for s in savings]
    positions = list(range(len(names)))
    ax.bar([p - 0.2 for p in positions], [s["rows"] for s in savings], width=0.4, label="sent")
    ax.bar([p + 0.2 for p in positions], [s["per_key_messages"] for s in savings], width=0.4, label="per-key")
    ax.set_xticks(positions, names, rotation=30, ha="right")
    ax.set(ylabel="messages", title="Saving from batching")
    ax.legend()
    paths.append(_save(fig, out_dir / "savings.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def cell(value: object) -> str:
    """`value` as the text of one Markdown table cell that shows it as it is: JSON string escapes for
    quotes, backslashes and line breaks (a key may hold any of them), `|` escaped so it cannot end
    the cell, `<` and `*`, `_`, backquotes escaped so nothing renders as markup."""
    text = json.dumps(value, ensure_ascii=False)[1:-1] if isinstance(value, str) else str(value)
    for char in "\\`*_<[]|":
        text = text.replace(char, "\\" + char)
    return text


def render_report(result: AuditResult, charts: Sequence[Path], out_dir: Path) -> Path:
    """A short Markdown report: headline numbers, storms, hot spots, reconciliation verdict."""
    s = result.summary
    t = s["totals"]
    recon = s["reconciliation"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x * 100:.1f}%"

    lines = [
        "# Invalidation audit",
        "",
        (
            f"Windows: {t['windows']} of {s['window_ms'] / 1000:g} s, {_utc(t['first_window_start'])} to"
            f" {_utc(t['last_window_start'])} UTC"
            if t["windows"]
            else "The log is empty: no invalidation rows, so no window, storm or hot spot."
        ),
        "",
        f"Read: {s['read']['description']}." if "read" in s else "",
        "",
        "| measure | value |",
        "|---|---|",
        f"| invalidation rows | {t['rows']} |",
        f"| keys invalidated | {t['keys']} |",
        f"| batched / single-key / invalidate-all rows | "
        f"{t['batched_rows']} / {t['single_key_rows']} / {t['invalidate_all_rows']} |",
        f"| payload bytes | {t['bytes']} |",
        f"| duplicate copies dropped | {t['duplicate_copies']} |",
        f"| messages sent / per-key / saved | {t['rows']} / {t['per_key_messages']} / {t['saved_messages']} "
        f"({pct(t['saving_ratio'])}) |",
        f"| subscribers ({s['subscribers_source']}) / fan-out messages | {s['subscribers']} / "
        f"{t['fanout_messages']} |",
        f"| persisted events / amplification | {t['events']} / "
        f"{'n/a' if t['amplification'] is None else format(t['amplification'], '.3f')} |",
        "",
        f"## Storms (rows per window > {s['storm_threshold']['rows']:g}, {s['storm_threshold']['source']})",
        "",
    ]
    if s["storms"]:
        lines += ["| window (UTC) | rows | keys | top cache |", "|---|---|---|---|"]
        lines += [
            f"| {_utc(w['window_start'])} | {w['rows']} | {w['keys']} | "
            f"{cell(w['top_cache'])} ({w['top_cache_rows']}) |"
            for w in s["storms"]
        ]
    else:
        lines.append("None.")
    lines += ["", "## Hottest caches", "", "| cache | rows | keys |", "|---|---|---|"]
    lines += [f"| {cell(c['cache_func'])} | {c['rows']} | {c['keys']} |" for c in s["top_caches"]]
    lines += ["", "## Hottest keys", "", "| cache | key | invalidations |", "|---|---|---|"]
    lines += [f"| {cell(k['cache_func'])} | {cell(k['key'])} | {k['invalidations']} |" for k in s["top_keys"]]
    lines += ["", "## Reconciliation", ""]
    if not recon["workers"]:
        lines.append("No applied-range record: nothing to reconcile.")
    else:
        lines += [
            "| worker | writer | applied / published in span | missed | lag |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {cell(w['worker_name'])} | {cell(w['instance_name'])} | {w['applied_rows']} /"
            f" {w['published_in_span']} | {w['missed_rows']} | {w['lag_rows']} |"
            for w in recon["workers"]
        ]
    lines.append("")
    if recon["gaps"]:
        lines += [f"**GAPS: {recon['missed_rows']} published rows never applied.**", ""]
        lines += ["| worker | run | writer | stream ids | missed rows |", "|---|---|---|---|---|"]
        lines += [
            f"| {cell(g['worker_name'])} | {cell(g['run_id'])} | {cell(g['instance_name'])} | "
            f"({g['hole_from']}, {g['hole_to']}] "
            f"| {g['missed_rows']} ({g['first_missed_id']}..{g['last_missed_id']}) |"
            for g in recon["gaps"]
        ]
    else:
        lines.append("No gaps.")
    lines += ["", "## Charts", ""] + [f"![{p.stem}]({p.name})" for p in charts]
    lines += [
        "",
        "---",
        "Definitions (docs/audit.md): a row is one stream id (extra copies are dropped); a batched",
        "(`_cache_fake`) row invalidates each distinct key it lists, any other row one key tuple, and",
        "keys NULL no single key; per-key messages are max(keys, 1) per row; windows are UTC,",
        "[start, start + window) in epoch ms; a storm is a window above the threshold; a key's count",
        "is the number of rows that invalidate it; a gap is a published row inside a worker's run",
        "but outside every range it recorded as applied.",
    ]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
