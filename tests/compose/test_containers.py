"""The stack in containers on a real Docker engine: the run of `make containers`, smaller.

Selected with `pytest -m containers` (`make test` leaves it out: tests/compose/conftest.py). It
starts dockerd when no engine answers and it is root; where no engine can start it fails with one
line saying why (chosen, it must run: no quiet skip). The images are the ones `make containers`
builds (cached by content), the stack gets free loopback ports and a project of its own, removed
at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from workers.harness.containers.__main__ import main

pytestmark = [pytest.mark.containers, pytest.mark.timeout(1800)]


def _why_no_engine() -> str | None:
    """None when an engine answers or can be started here; else why not, in one line."""
    if shutil.which("docker") is None or shutil.which("docker-compose") is None:
        return "no docker client or docker-compose (make docker-compose installs them)"
    answers = subprocess.run(["docker", "version"], capture_output=True, timeout=20).returncode == 0
    if answers:
        return None
    if shutil.which("dockerd") is None:
        return "no Docker engine answers and dockerd is not installed (make dockerd installs it)"
    if os.geteuid() != 0:
        return "no Docker engine answers and starting dockerd takes root"
    return None


def test_the_stack_runs_in_containers(tmp_path: Path) -> None:
    reason = _why_no_engine()
    if reason is not None:  # chosen with -m containers: a gap is a failure, never a quiet skip
        pytest.fail(f"the containers cannot run here: {reason}", pytrace=False)
    code = main(["--workdir", str(tmp_path), "--users", "12", "--rooms", "4", "--actions", "600"])
    summary_path = tmp_path / "summary.json"
    assert summary_path.exists(), f"make containers stopped early (exit {code})"
    summary = json.loads(summary_path.read_text())
    assert code == 0, summary["problems"]
    for load in ("load", "faults"):
        figures = summary[load]
        assert figures["acknowledged"] > 0 and figures["checked"] > 0
        assert [figures[k] for k in ("lost", "duplicated", "reordered", "other")] == [0, 0, 0, 0]
        assert figures["answered_500"] == 0
    assert all(count >= 1 for count in summary["faults"]["restarts"].values())
    workers = {name: stop for name, stop in summary["stop"].items() if name not in ("postgres", "redis")}
    assert len(workers) == 5 and all(stop["exit"] == 0 for stop in workers.values()), workers
    assert summary["audit"]["exit"] == 0 and summary["audit"]["files"] > 0
