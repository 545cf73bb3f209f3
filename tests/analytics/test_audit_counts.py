"""The known log (see conftest) yields exactly the counts worked out by hand from its rows."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

import analytics
from tests.analytics.conftest import KNOWN_ROWS, T0, w


def rows_of(frame: DataFrame, *order: str) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in (frame.orderBy(*order) if order else frame).collect()]


def test_totals(known_audit: analytics.AuditResult) -> None:
    t = known_audit.summary["totals"]
    assert t["rows"] == 40
    assert t["duplicate_copies"] == 2
    assert t["keys"] == 102
    assert (t["batched_rows"], t["single_key_rows"], t["invalidate_all_rows"]) == (3, 36, 1)
    assert t["per_key_messages"] == 103
    assert t["saved_messages"] == 63
    assert t["saving_ratio"] == pytest.approx(63 / 103)
    assert known_audit.summary["subscribers"] == 3
    assert known_audit.summary["subscribers_source"] == "applied_record"
    assert (t["fanout_messages"], t["per_key_fanout_messages"]) == (120, 309)
    assert t["events"] == 18
    assert t["amplification"] == pytest.approx(40 / 18)
    assert (t["windows"], t["first_window_start"], t["last_window_start"]) == (5, T0, w(4))


def test_bytes_are_the_compact_json_payload(known_audit: analytics.AuditResult) -> None:
    expected = sum(len(json.dumps([f, k, ts], separators=(",", ":"))) for _, _, f, k, ts in KNOWN_ROWS)
    assert known_audit.summary["totals"]["bytes"] == expected


def test_window_totals_include_the_empty_window(known_audit: analytics.AuditResult) -> None:
    series = [(s["window_start"], s["rows"], s["keys"], s["events"]) for s in known_audit.window_series]
    assert series == [(w(0), 4, 6, 3), (w(1), 3, 3, 1), (w(2), 3, 63, 4), (w(3), 0, 0, 0), (w(4), 30, 30, 10)]
    amplification = [s["amplification"] for s in known_audit.window_series]
    assert amplification == [pytest.approx(4 / 3), 3.0, 0.75, None, 3.0]


def test_window_stats_per_cache_and_writer(known_audit: analytics.AuditResult) -> None:
    stats = known_audit.tables["window_stats"]
    assert stats.count() == 10
    by_key = {(r["window_start"], r["cache_func"], r["instance_name"]): r for r in rows_of(stats)}
    batched = by_key[(w(2), "cs_cache_fake", "p2")]
    assert (batched["rows"], batched["keys"], batched["batched_rows"]) == (2, 62, 2)
    assert (batched["per_key_messages"], batched["saved_messages"]) == (62, 60)
    assert (batched["events"], batched["amplification"]) == (4, 0.5)
    assert (batched["fanout_messages"], batched["per_key_fanout_messages"]) == (6, 186)
    assert (batched["first_stream_id"], batched["last_stream_id"]) == (8, 9)
    duplicated = by_key[(w(0), "get_users_in_room", "p1")]
    assert (duplicated["rows"], duplicated["duplicate_copies"], duplicated["amplification"]) == (1, 1, 0.5)
    storm = by_key[(w(4), "get_user_by_id", "p1")]
    assert (storm["rows"], storm["single_key_rows"], storm["duplicate_copies"], storm["amplification"]) == (
        30,
        30,
        1,
        3.0,
    )
    room_only = by_key[(w(1), "cs_cache_fake", "p1")]
    assert (room_only["keys"], room_only["batched_rows"], room_only["single_key_rows"]) == (1, 0, 1)
    all_ = by_key[(w(0), "get_rooms_for_user", "p2")]
    assert (all_["keys"], all_["invalidate_all_rows"], all_["per_key_messages"]) == (0, 1, 1)
    no_events = by_key[(w(1), "get_membership", "p2")]
    assert (no_events["keys"], no_events["events"], no_events["amplification"]) == (1, 0, None)


def test_storms_above_p99(known_audit: analytics.AuditResult) -> None:
    threshold = known_audit.summary["storm_threshold"]
    assert threshold["source"] == "p99"
    assert threshold["rows"] == pytest.approx(4 + 0.96 * 26)  # exact p99 of [0, 3, 3, 4, 30]
    storms = known_audit.summary["storms"]
    assert [(s["window_start"], s["rows"], s["top_cache"], s["top_cache_rows"]) for s in storms] == [
        (w(4), 30, "get_user_by_id", 30)
    ]


def test_storms_above_a_configured_threshold(known_audit: analytics.AuditResult) -> None:
    totals, stats = known_audit.tables["window_totals"], known_audit.tables["window_stats"]
    threshold = analytics.storm_threshold(totals, 3, 0.99)
    assert threshold == analytics.StormThreshold(3.0, "configured")
    found = rows_of(analytics.storms(totals, stats, threshold), "window_start")
    # window 0 has one row each of four caches: the tie goes to the first name.
    assert [(s["window_start"], s["rows"], s["top_cache"]) for s in found] == [
        (w(0), 4, "cs_cache_fake"),
        (w(4), 30, "get_user_by_id"),
    ]


def test_savings_by_cache(known_audit: analytics.AuditResult) -> None:
    savings = {s["cache_func"]: s for s in known_audit.summary["savings_by_cache"]}
    cs = savings["cs_cache_fake"]
    assert (cs["rows"], cs["keys"], cs["per_key_messages"], cs["saved_messages"]) == (4, 67, 67, 63)
    assert cs["saving_ratio"] == pytest.approx(63 / 67)
    assert savings["get_user_by_id"]["saved_messages"] == 0
    rooms_for_user = savings["get_rooms_for_user"]
    assert (rooms_for_user["keys"], rooms_for_user["per_key_messages"]) == (0, 1)
    assert known_audit.summary["savings_by_cache"][0]["cache_func"] == "cs_cache_fake"


def test_top_n_caches_and_keys(known_audit: analytics.AuditResult) -> None:
    caches = [(c["cache_func"], c["rows"]) for c in known_audit.summary["top_caches"]]
    assert caches == [("get_user_by_id", 31), ("cs_cache_fake", 4), ("get_users_in_room", 3)]
    # @u0 was seen twice (same stream id 11): counted once it ties at 3 and sorts after cs_cache_fake.
    keys = [(k["cache_func"], k["key"], k["invalidations"]) for k in known_audit.summary["top_keys"]]
    assert keys == [("cs_cache_fake", "!r1", 3), ("get_user_by_id", "@u0", 3), ("get_user_by_id", "@u1", 3)]


def test_tuple_keys_and_invalidate_all_in_top_keys(known_audit: analytics.AuditResult) -> None:
    everything = rows_of(analytics.top_keys(known_audit.tables["_annotated"], 1000), "cache_func", "key")
    by_cache: dict[str, list[tuple[str, int]]] = {}
    for k in everything:
        by_cache.setdefault(k["cache_func"], []).append((k["key"], k["invalidations"]))
    assert by_cache["get_membership"] == [('["!r2","@d"]', 1)]
    assert "get_rooms_for_user" not in by_cache  # keys NULL names no key
    assert len(by_cache["cs_cache_fake"]) == 1 + 3 + 1 + 60  # !r1, @a @b @c, !r2, @m00..@m59
    assert sum(n for _, n in by_cache["cs_cache_fake"]) == 67


def test_two_minute_windows(spark: SparkSession, known_audit: analytics.AuditResult) -> None:
    annotated = analytics.annotate(
        known_audit.tables["_annotated"].select(*analytics.INVALIDATIONS_SCHEMA.fieldNames(), "copies"),
        120_000,
    )
    stats = analytics.window_stats(annotated, 1)
    events = spark.createDataFrame([], analytics.EVENTS_SCHEMA)
    totals = analytics.window_totals(stats, analytics.events_per_window(events, 120_000), 120_000)
    assert [(r["window_start"], r["rows"]) for r in rows_of(totals, "window_start")] == [
        (T0, 7),
        (T0 + 120_000, 3),
        (T0 + 240_000, 30),
    ]


def test_dedupe_counts_each_stream_id_once(spark: SparkSession) -> None:
    raw = spark.createDataFrame(
        [*[(1, "p1", "c", ["k"], 5)] * 3, (2, "p2", "c", None, 6)],
        analytics.INVALIDATIONS_SCHEMA,
    )
    deduped = rows_of(analytics.dedupe(raw), "stream_id")
    assert [(r["stream_id"], r["copies"]) for r in deduped] == [(1, 3), (2, 1)]
    assert deduped[1]["keys"] is None
