"""The reload logic on its own: what a reloaded file changes online, and what it is refused."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from workers.assembly.reload import ConfigReload, ReloadRefused, WriterChange, plan_reload
from workers.config import WorkerConfig, load_config

BASE: dict[str, Any] = {
    "instance_name": "sync1",
    "database_url": "postgresql://u@localhost/db",
    "redis_url": "redis://localhost:6379/0",
    "stream_writers": {"events": ["p1", "p2"], "typing": ["p1"]},
    "instance_map": {"p1": "http://127.0.0.1:8001", "p2": "http://127.0.0.1:8002"},
}


def config(**changes: Any) -> WorkerConfig:
    return load_config(None, **{**BASE, **changes})


def test_added_and_removed_writers_are_named_per_stream() -> None:
    new = config(
        stream_writers={"events": ["p1", "p3"], "typing": ["p1"]},
        instance_map={**BASE["instance_map"], "p3": "http://127.0.0.1:8003"},
    )
    plan = plan_reload(config(), new)
    events = WriterChange("events", ("p3",), ("p2",), False)
    assert events in plan.changes
    assert {c.stream for c in plan.changes} >= {"events", "caches", "account_data", "receipts"}
    assert plan.instance_map and plan.restart_only == ()
    assert plan.config.writers_of("events") == ["p1", "p3"]
    assert "events: +p3 -p2" in plan.describe() and "instance_map changed" in plan.describe()


def test_a_new_order_is_a_change_the_same_list_is_none() -> None:
    plan = plan_reload(config(), config(stream_writers={"events": ["p2", "p1"], "typing": ["p1"]}))
    assert WriterChange("events", (), (), True) in plan.changes
    assert plan_reload(config(), config()).empty


def test_a_setting_that_needs_a_restart_keeps_its_value_and_is_named() -> None:
    new = config(http_port=9999, writer_wait_s=3.0, stream_writers={"events": ["p1"], "typing": ["p2"]})
    plan = plan_reload(config(), new)
    assert set(plan.restart_only) == {"http_port", "writer_wait_s", "stream_writers.typing"}
    assert plan.config.http_port == 8080 and plan.config.writer_wait_s == 10.0
    assert plan.config.writers_of("typing") == ["p1"]
    assert plan.config.writers_of("events") == ["p1"], "the writer change still applies"


def test_becoming_a_writer_is_refused_while_running() -> None:
    with pytest.raises(ReloadRefused, match="sync1 would become a writer of events"):
        plan_reload(config(), config(stream_writers={"events": ["p1", "sync1"]}))


def test_leaving_the_writers_is_allowed() -> None:
    old = config(instance_name="p2")
    plan = plan_reload(old, config(instance_name="p2", stream_writers={"events": ["p1"], "typing": ["p1"]}))
    assert WriterChange("events", (), ("p2",), False) in plan.changes


def test_a_result_that_does_not_validate_is_refused() -> None:
    old = config(read_workers=["p1"], serve_reads=False)
    new = config(serve_reads=False, instance_map={"p2": "http://127.0.0.1:8002"})  # read_workers: restart
    with pytest.raises(ReloadRefused, match="read_workers"):
        plan_reload(old, new)
    with pytest.raises(ReloadRefused, match="no writer of the 'events' stream"):
        plan_reload(config(), config(stream_writers={"typing": ["p1"]}))


def test_stored_streams_with_their_own_writers_do_not_follow_events() -> None:
    pinned = {"events": ["p1", "p2"], "account_data": ["p1", "p2"]}
    plan = plan_reload(config(stream_writers=pinned), config(stream_writers={**pinned, "events": ["p1"]}))
    streams = {c.stream for c in plan.changes}
    assert "account_data" not in streams and "to_device" in streams
    assert plan.config.writers_of("account_data") == ["p1", "p2"]


def test_the_reloader_reads_the_file_and_refuses_bad_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "workers.assembly.reload")
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(BASE))
    registry = CollectorRegistry()
    reload = ConfigReload(path, load_config(path), registry)
    assert reload.read() is None  # nothing changed

    path.write_text("stream_writers: [not, a, mapping")
    assert reload.read() is None
    path.write_text(yaml.safe_dump({**BASE, "stream_writers": {"events": "p1"}}))
    assert reload.read() is None
    refused = [r for r in caplog.records if "config reload refused" in r.getMessage()]
    assert len(refused) == 2 and all(r.exc_info is None and "\n" not in r.getMessage() for r in refused)
    assert registry.get_sample_value("fanout_config_reloads_total", {"outcome": "refused"}) == 2
    assert reload.config.writers_of("events") == ["p1", "p2"]

    path.write_text(yaml.safe_dump({**BASE, "stream_writers": {"events": ["p1"], "typing": ["p1"]}}))
    plan = reload.read()
    assert plan is not None and reload.config.writers_of("events") == ["p1"]
    assert registry.get_sample_value("fanout_config_reloads_total", {"outcome": "applied"}) == 1
    assert any("config reload: events: -p2" in r.getMessage() for r in caplog.records)
