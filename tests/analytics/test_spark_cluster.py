"""The audit on a Spark cluster: a standalone master and one worker started here on loopback
(`spark-class` from the installed pyspark), the audit submitted to `spark://...` unchanged, its
JDBC read split across the executor's tasks, and its results equal to the local run's."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import analytics
from workers.services import free_port

ROOT = Path(__file__).resolve().parents[2]
SPARK_CLASS = Path(sys.executable).with_name("spark-class")
SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")
ENV = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


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
            stdout=open(logs / "master.log", "wb"), stderr=subprocess.STDOUT, env=ENV,
        )  # fmt: skip
        started.append(master)
        _wait_port(port, master)
        url = f"spark://127.0.0.1:{port}"
        worker = subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
             "--cores", "2", "--memory", "1g", "--webui-port", str(worker_ui),
             "--work-dir", str(logs / "work")],
            stdout=open(logs / "worker.log", "wb"), stderr=subprocess.STDOUT, env=ENV,
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


def _audit(master: str, url: str, out: Path, zip_path: Path) -> dict[str, object]:
    entry = zip_path.parent / "audit.py"
    shutil.copy(ROOT / "analytics" / "audit.py", entry)
    command = [str(SPARK_SUBMIT), "--master", master, "--py-files", str(zip_path),
               "--jars", analytics.resolve_jdbc_jar(None), "--conf", "spark.sql.shuffle.partitions=4",
               "--conf", "spark.executor.memory=768m",
               str(entry), "run", "--database-url", url, "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=zip_path.parent, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert f"master={master}" in done.stdout  # the job ran where it was sent
    summary: dict[str, object] = json.loads((out / "summary.json").read_text())
    return summary


def test_the_audit_on_a_standalone_master_equals_the_local_run(
    spark_master: str, known_log_url: str, tmp_path: Path
) -> None:
    zip_path = tmp_path / "analytics.zip"
    subprocess.run([sys.executable, str(ROOT / "analytics" / "bundle.py"), str(zip_path)], check=True)
    on_cluster = _audit(spark_master, known_log_url, tmp_path / "cluster", zip_path)
    local = _audit("local[2]", known_log_url, tmp_path / "local", zip_path)
    for key in ("totals", "storms", "savings_by_cache", "top_caches", "top_keys", "reconciliation"):
        assert on_cluster.get(key) == local.get(key), key
    assert on_cluster["totals"]["rows"] == 40  # type: ignore[index]
