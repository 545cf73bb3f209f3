"""Every metric the alert rules and the Grafana dashboard use exists on a real worker's /metrics,
scraped with no /health call before it (gauges are computed at scrape time)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import yaml

from tests.workers.conftest import MakeWorker, make_worker

__all__ = ["make_worker"]  # the in-process worker fixture, shared with tests/workers

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
_METRIC = re.compile(r"\bfanout_[a-z_]+")


def _used_metrics() -> set[str]:
    rules = yaml.safe_load((COMPOSE / "prometheus" / "alerts.yml").read_text())
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((COMPOSE / "grafana" / "fanout-dashboard.json").read_text())
    expressions += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    return {name for expression in expressions for name in _METRIC.findall(expression)}


async def test_every_used_metric_is_exposed(make_worker: MakeWorker) -> None:
    worker = await make_worker("p1", ["p1"])
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{worker.http_port}/metrics") as response:
            text = await response.text()
    exposed = set(re.findall(r"^# TYPE (\S+)", text, re.MULTILINE))
    exposed |= {name + "_total" for name in exposed}
    used = _used_metrics()
    assert {"fanout_worker_ready", "fanout_repl_lag"} <= used
    assert used <= exposed, sorted(used - exposed)
    assert "fanout_worker_ready 1.0" in text
