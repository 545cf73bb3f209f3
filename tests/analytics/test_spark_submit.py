"""The documented spark-submit line runs the audit from the zip `make audit-zip` builds, and the
audit takes its master from spark-submit unless `--master` says otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import analytics

ROOT = Path(__file__).resolve().parents[2]
SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")


@pytest.fixture(scope="module")
def audit_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    subprocess.run(["make", "-s", "audit-zip", f"PYTHON={sys.executable}"], cwd=ROOT, check=True)
    built = ROOT / "dist" / "analytics.zip"
    names = set(zipfile.ZipFile(built).namelist())
    package = {f"analytics/{p.name}" for p in (ROOT / "analytics").glob("*.py")}
    assert package <= names, package - names
    copy = tmp_path_factory.mktemp("zip") / "analytics.zip"
    shutil.copy(built, copy)
    return copy


def _submit(
    audit_zip: Path, master: str, url: str, out: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    entry = audit_zip.parent / "audit.py"
    shutil.copy(ROOT / "analytics" / "audit.py", entry)  # run from outside the checkout
    command = [str(SPARK_SUBMIT), "--master", master, "--py-files", str(audit_zip),
               "--jars", analytics.resolve_jdbc_jar(None), "--conf", "spark.sql.shuffle.partitions=4",
               str(entry), "run", "--database-url", url, "--out", str(out), *extra]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=audit_zip.parent, env=env)


def test_the_documented_spark_submit_line_runs_the_audit(
    audit_zip: Path, known_log_url: str, tmp_path: Path
) -> None:
    done = _submit(audit_zip, "local[2]", known_log_url, tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    # spark-submit hands the Python driver's stderr on through its stdout
    assert "step=session master=local[2]" in done.stdout  # spark-submit's master, not one set in code
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["totals"]["rows"] == 40  # the known log (conftest.py)


def test_an_explicit_master_wins(audit_zip: Path, known_log_url: str, tmp_path: Path) -> None:
    done = _submit(audit_zip, "local[2]", known_log_url, tmp_path / "out", "--master", "local[1]")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step=session master=local[1]" in done.stdout


def test_the_compose_audit_service_command_runs(audit_zip: Path, known_log_url: str, tmp_path: Path) -> None:
    """compose's `audit` service, its command line run here with the container's paths mapped to
    this machine's: a typo in it fails this test."""
    import yaml

    service = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())["services"]["audit"]
    assert service["entrypoint"] == ["sh", "-c"]
    entry = audit_zip.parent / "audit.py"
    shutil.copy(ROOT / "analytics" / "audit.py", entry)
    line = service["command"][0].replace("$$", "$")  # compose's escape for a literal $
    for inside, here in (
        ("spark-submit ", f"{SPARK_SUBMIT} "),
        ("/app/dist/analytics.zip", str(audit_zip)),
        ("/usr/share/java/postgresql.jar", analytics.resolve_jdbc_jar(None)),
        ("/app/analytics/audit.py", str(entry)),
        ("/data/audit", str(tmp_path / "out")),
    ):
        assert inside in line, inside
        line = line.replace(inside, here)
    env = {**os.environ, "FANOUT_DATABASE_URL": known_log_url, "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}  # fmt: skip
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["totals"]["rows"] == 40
