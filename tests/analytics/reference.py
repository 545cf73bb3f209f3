"""The audit's definitions (docs/audit.md) in plain Python, over the same rows: the reference the
Spark job's figures are checked against. Written from the text, not from the job's code."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

#: (stream_id, instance_name, cache_func, keys or None, invalidation_ts ms)
Row = tuple[int, str, str, list[str] | None, int]


def _batched(cache: str) -> bool:
    return cache.endswith("_cache_fake")


def keys_of(cache: str, keys: list[str] | None) -> list[str]:
    """The keys a row invalidates: each distinct element of a batched cache's array, or the one
    tuple key of any other cache (its sole element, or its compact JSON)."""
    if keys is None:
        return []
    if _batched(cache):
        return list(dict.fromkeys(keys))
    return [keys[0] if len(keys) == 1 else json.dumps(keys, separators=(",", ":"), ensure_ascii=False)]


def payload_bytes(cache: str, keys: list[str] | None, ts: int) -> int:
    return len(json.dumps([cache, keys, ts], separators=(",", ":"), ensure_ascii=False).encode())


def audit(rows: Sequence[Row], window_ms: int, threshold: float, top_n: int) -> dict[str, Any]:
    """totals, storms, top caches and keys and savings, as summary.json states them."""
    copies = Counter(r[0] for r in rows)
    first: dict[int, Row] = {}
    for row in rows:
        first.setdefault(row[0], row)
    unique = list(first.values())
    if not unique:
        return {"rows": 0, "windows": 0, "first_window_start": None, "last_window_start": None,
                "storms": [], "top_keys": [], "top_caches": []}  # fmt: skip
    per_window: dict[int, int] = defaultdict(int)
    totals = Counter[str]()
    key_rows = Counter[tuple[str, str]]()
    cache_rows = Counter[str]()
    for stream_id, _, cache, keys, ts in unique:
        start = ts - ts % window_ms  # Python's % floors: the window of a negative ts too
        per_window[start] += 1
        invalidated = len(keys_of(cache, keys)) if (keys is None or _batched(cache)) else 1
        kind = "invalidate_all" if keys is None else "batched" if invalidated > 1 else "single_key"
        totals["rows"] += 1
        totals["keys"] += invalidated
        totals[f"{kind}_rows"] += 1
        totals["per_key_messages"] += max(invalidated, 1)
        totals["bytes"] += payload_bytes(cache, keys, ts)
        totals["duplicate_copies"] += copies[stream_id] - 1
        cache_rows[cache] += 1
        for key in keys_of(cache, keys):
            key_rows[(cache, key)] += 1
    totals["saved_messages"] = totals["per_key_messages"] - totals["rows"]
    lo, hi = min(per_window), max(per_window)
    windows = list(range(lo, hi + window_ms, window_ms))
    storms = [(w, per_window.get(w, 0)) for w in windows if per_window.get(w, 0) > threshold]
    top_keys = sorted(key_rows.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1]))[:top_n]
    top_caches = sorted(cache_rows.items(), key=lambda kv: (-kv[1], kv[0]))[:top_n]
    return {
        **totals,
        "windows": len(windows),
        "first_window_start": lo,
        "last_window_start": hi,
        "storms": storms,
        "top_keys": [(c, k, n) for (c, k), n in top_keys],
        "top_caches": top_caches,
    }
