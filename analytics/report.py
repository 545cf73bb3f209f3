"""The audit's outputs: a Parquet directory per table, `summary.json`, PNG charts and `report.md`."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analytics.job import AuditResult

log = logging.getLogger("analytics.audit")


@dataclass(frozen=True)
class OutputPaths:
    """Where `write_outputs` put things."""

    out_dir: Path
    tables: dict[str, Path]
    summary: Path
    charts: list[Path]
    report: Path


def write_outputs(result: AuditResult, out_dir: Path) -> OutputPaths:
    """Parquet per table, `summary.json`, PNG charts and `report.md` under `out_dir` (overwritten)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tables: dict[str, Path] = {}
    for name, frame in result.tables.items():
        if name.startswith("_"):
            continue
        path = out_dir / name
        log.info("step=write table=%s", name)
        frame.write.mode("overwrite").parquet(str(path))
        tables[name] = path
    summary_path = out_dir / "summary.json"
    summary_path.write_text(json.dumps(result.summary, indent=2, sort_keys=True, default=str) + "\n")
    charts = render_charts(result, out_dir)
    report = render_report(result, charts, out_dir)
    return OutputPaths(out_dir, tables, summary_path, charts, report)


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def render_charts(result: AuditResult, out_dir: Path) -> list[Path]:
    """Rows per window (with the storm threshold), top caches, and batching savings per cache."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, series = result.summary, result.window_series
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(10, 4))
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

    fig, ax = plt.subplots(figsize=(8, 4))
    caches = list(reversed(summary["top_caches"]))
    ax.barh([c["cache_func"] for c in caches], [c["rows"] for c in caches])
    ax.set(xlabel="rows", title="Hottest caches")
    paths.append(_save(fig, out_dir / "top_caches.png"))

    fig, ax = plt.subplots(figsize=(8, 4))
    savings = summary["savings_by_cache"][: max(1, len(summary["top_caches"]))]
    names = [s["cache_func"] for s in savings]
    positions = list(range(len(names)))
    ax.bar([p - 0.2 for p in positions], [s["rows"] for s in savings], width=0.4, label="sent")
    ax.bar([p + 0.2 for p in positions], [s["per_key_messages"] for s in savings], width=0.4, label="per-key")
    ax.set_xticks(positions, names, rotation=30, ha="right")
    ax.set(ylabel="messages", title="Saving from batching")
    ax.legend()
    paths.append(_save(fig, out_dir / "savings.png"))
    plt.close("all")
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


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
        f"Windows: {t['windows']} of {s['window_ms'] / 1000:g} s"
        + (
            f", {_utc(t['first_window_start'])} to {_utc(t['last_window_start'])} UTC" if t["windows"] else ""
        ),
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
            f"{w['top_cache']} ({w['top_cache_rows']}) |"
            for w in s["storms"]
        ]
    else:
        lines.append("None.")
    lines += ["", "## Hottest caches", "", "| cache | rows | keys |", "|---|---|---|"]
    lines += [f"| {c['cache_func']} | {c['rows']} | {c['keys']} |" for c in s["top_caches"]]
    lines += ["", "## Hottest keys", "", "| cache | key | invalidations |", "|---|---|---|"]
    lines += [f"| {k['cache_func']} | `{k['key']}` | {k['invalidations']} |" for k in s["top_keys"]]
    lines += ["", "## Reconciliation", ""]
    if not recon["workers"]:
        lines.append("No applied-range record: nothing to reconcile.")
    else:
        lines += [
            "| worker | writer | applied / published in span | missed | lag |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {w['worker_name']} | {w['instance_name']} | {w['applied_rows']} / {w['published_in_span']} | "
            f"{w['missed_rows']} | {w['lag_rows']} |"
            for w in recon["workers"]
        ]
    lines.append("")
    if recon["gaps"]:
        lines += [f"**GAPS: {recon['missed_rows']} published rows never applied.**", ""]
        lines += ["| worker | run | writer | stream ids | missed rows |", "|---|---|---|---|---|"]
        lines += [
            f"| {g['worker_name']} | {g['run_id']} | {g['instance_name']} | "
            f"({g['hole_from']}, {g['hole_to']}] "
            f"| {g['missed_rows']} ({g['first_missed_id']}..{g['last_missed_id']}) |"
            for g in recon["gaps"]
        ]
    else:
        lines.append("No gaps.")
    lines += ["", "## Charts", ""] + [f"![{p.stem}]({p.name})" for p in charts]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
