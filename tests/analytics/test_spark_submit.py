"""The documented spark-submit line runs the audit from the zip `make audit-zip` builds, and the
audit takes its master from spark-submit unless `--master` says otherwise."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

import analytics
from tests.analytics.conftest import ROOT, SPARK_SUBMIT, spark_env, submit


def test_the_documented_spark_submit_line_runs_the_audit(
    submitted_locally: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = submitted_locally
    assert done.returncode == 0, done.stderr[-3000:]
    # spark-submit hands the Python driver's stderr on through its stdout
    assert "step=session master=local[2]" in done.stdout  # spark-submit's master, not one set in code
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["rows"] == 40  # the known log (conftest.py)


def test_an_explicit_master_wins(audit_zip: Path, known_log_url: str, tmp_path: Path) -> None:
    done = submit(audit_zip, "local[2]", known_log_url, tmp_path / "out", "--master", "local[1]")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step=session master=local[1]" in done.stdout


def test_the_compose_audit_service_command_runs(audit_zip: Path, known_log_url: str, tmp_path: Path) -> None:
    """compose's `audit` service, its command line run here with the container's paths mapped to
    this machine's: a typo in it fails this test. Spark's defaults file here (SPARK_CONF_DIR) sets
    4 shuffle partitions, as every other audit run of the tests does: the default 200 tasks per
    shuffle would double the run's minute on 2 cores, on a log of 40 rows."""
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
    conf = tmp_path / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.sql.shuffle.partitions 4\n")
    env = spark_env(FANOUT_DATABASE_URL=known_log_url, SPARK_CONF_DIR=str(conf))
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["totals"]["rows"] == 40
