"""`fanout bench peer`: Synapse's configuration, the CPU accounting, and a tiny real run of both systems.

The run needs Synapse's venv (`make synapse-peer` builds it before `make test`; built here when
missing); a venv that cannot be built (no PyPI, no compiler) fails it with pip's one-line reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.harness.bench.peer.cpu import Accounts, process_cpu, spent, tree_cpu
from workers.harness.bench.peer.synapse_build import build_synapse
from workers.harness.bench.peer.synapse_config import (
    PERSISTERS,
    RATE_LIMITS,
    SYNC_WORKER,
    SynapseLayout,
    homeserver_config,
    worker_config,
)
from workers.harness.upgrade_build import BuildError


def test_synapse_runs_redis_workers_on_loopback_without_rate_limits_or_federation(tmp_path: Path) -> None:
    layout = SynapseLayout(tmp_path, "synapse_db", postgres_port=5432, redis_port=6379)
    main = homeserver_config(layout)
    assert main["stream_writers"] == {"events": list(PERSISTERS)}
    assert set(main["instance_map"]) == {"main", *PERSISTERS}  # whoever is reached over replication
    assert main["redis"] == {"enabled": True, "host": "127.0.0.1", "port": 6379}
    assert main["database"]["args"]["database"] == "synapse_db"
    assert main["federation_domain_whitelist"] == [] and main["federation_sender_instances"] == []
    listeners = [
        main["listeners"],
        *(worker_config(layout, n)["worker_listeners"] for n in (*PERSISTERS, SYNC_WORKER)),
    ]
    every = [one for group in listeners for one in group]
    assert {one["bind_addresses"][0] for one in every} == {"127.0.0.1"}
    assert {r for one in every for res in one["resources"] for r in res["names"]} == {"client", "replication"}
    for name, setting in RATE_LIMITS.items():
        limits = setting.values() if "per_second" not in setting else [setting]
        assert all(one["per_second"] >= 1e6 for one in limits), name
        assert main[name] == setting


def test_a_process_tree_keeps_the_cpu_of_a_child_that_ended() -> None:
    """PostgreSQL's backends come and go: one that ends between two samples is still counted."""
    before = Accounts(trees={"me": os.getpid()}).sample()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)  # reaped: in our cutime now
    after = Accounts(trees={"me": os.getpid()}).sample()
    assert spent(before, after)["me"] >= 0.25
    assert tree_cpu(os.getpid()) >= process_cpu(os.getpid())
    assert process_cpu(2**22 + 1) == 0.0  # a process that is gone counts nothing


@pytest.mark.timeout(900)  # a first build of Synapse's venv takes minutes; cached, the run ~1 min
def test_bench_peer_drives_both_systems_alike_and_reports_the_ratios(tmp_path: Path) -> None:
    try:  # `make test` builds it first (make synapse-peer); here it is only checked or built
        build_synapse(say=lambda line: None)
    except BuildError as e:
        pytest.fail(f"Synapse's venv cannot be built here: {e}", pytrace=False)
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "bench", "peer", "--quick", "--senders", "4", "--readers", "2",
         "--profile", str(tmp_path / "prof")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert [(r["system"], r["round"]) for r in result["runs"]] == [("fanout", 1), ("synapse", 1)]
    assert result["fanout"] == {  # as compose/ deploys it: the persisters only write
        "persister1": {"writes_events": True, "serve_reads": False},
        "persister2": {"writes_events": True, "serve_reads": False},
        "sync1": {"writes_events": False, "serve_reads": True},
    }
    for run in (result["ceiling"], *result["runs"]):
        saturation, steady = run["saturation"], run["latency"]
        assert saturation["sends_answered"] > 0 and saturation["errors"] == 0
        assert saturation["cpu_s_per_1000"]["servers"] > 0 and saturation["driver_cores"] > 0
        assert steady["sent"] == 30 and steady["failed"] == steady["missing"] == 0  # 10/s for 3 s
        assert steady["start_seen"]["samples"] == 30
        assert steady["answered_seen"]["p50_ms"] <= steady["start_seen"]["p50_ms"]
    for run in result["runs"]:  # the servers' own PostgreSQL and Redis were counted
        assert run["saturation"]["cpu_s_per_1000"]["postgres_redis"] > 0
    for phase in ("round1-saturation", "round1-latency"):  # --profile: fanout's workers, each window
        for worker in result["fanout"]:
            assert (tmp_path / "prof" / phase / f"{worker}.txt").read_text().startswith(f"{worker}\n")
    sent = (tmp_path / "prof" / "round1-saturation" / "persister1.stacks").read_text()
    sent += (tmp_path / "prof" / "round1-saturation" / "persister2.stacks").read_text()
    assert "_persist_batch (" in sent
    lines = done.stderr.splitlines()
    assert any(line.startswith("ahead of Synapse 1.163.2: sends/s (fanout / Synapse): ") for line in lines)
    assert any("server CPU per event (Synapse / fanout)" in line and "target >= 70" in line for line in lines)
