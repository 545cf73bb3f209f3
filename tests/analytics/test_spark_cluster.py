"""The audit on a Spark cluster: a standalone master and one worker started here on loopback
(`spark-class` from the installed pyspark), the audit submitted to `spark://...` unchanged, its
JDBC read split across the executor's tasks, and its results equal to the local run's."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.analytics.conftest import spark_env, submit
from workers.embedded.services import free_port

SPARK_CLASS = Path(sys.executable).with_name("spark-class")


def _wait_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the Spark process exited"
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture(scope="module")
def spark_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("spark-cluster")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    started: list[subprocess.Popen[bytes]] = []
    try:
        master = subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui)],
            stdout=open(logs / "master.log", "wb"), stderr=subprocess.STDOUT, env=spark_env(),
        )  # fmt: skip
        started.append(master)
        _wait_port(port, master)
        url = f"spark://127.0.0.1:{port}"
        worker = subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
             "--cores", "2", "--memory", "1g", "--webui-port", str(worker_ui),
             "--work-dir", str(logs / "work")],
            stdout=open(logs / "worker.log", "wb"), stderr=subprocess.STDOUT, env=spark_env(),
        )  # fmt: skip
        started.append(worker)
        _wait_port(worker_ui, worker)
        yield url
    finally:
        for process in reversed(started):
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def test_the_audit_on_a_standalone_master_equals_the_local_run(
    spark_master: str,
    audit_zip: Path,
    known_log_url: str,
    submitted_locally: tuple[subprocess.CompletedProcess[str], Path],
    tmp_path: Path,
) -> None:
    done = submit(
        audit_zip, spark_master, known_log_url, tmp_path / "cluster", conf=["spark.executor.memory=768m"]
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert f"master={spark_master}" in done.stdout  # the job ran where it was sent
    on_cluster = json.loads((tmp_path / "cluster" / "summary.json").read_text())
    local_run, local_out = submitted_locally  # the same line with --master local[2]
    assert local_run.returncode == 0, local_run.stderr[-3000:]
    local = json.loads((local_out / "summary.json").read_text())
    for key in ("totals", "storms", "savings_by_cache", "top_caches", "top_keys", "reconciliation"):
        assert on_cluster.get(key) == local.get(key), key
    assert on_cluster["totals"]["rows"] == 40
