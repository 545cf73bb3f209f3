"""The operator's notebook executes headlessly, on a small generated log, in a kernel running this Python."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import asyncpg
import nbformat
import pytest
from nbclient import NotebookClient

import analytics
from analytics.generate import generate_log
from tests.analytics.conftest import insert_ranges, scratch_database
from tests.conftest import Servers

NOTEBOOK = Path(analytics.__file__).with_name("audit.ipynb")


async def _small_log(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await generate_log(conn, 2000, step_ms=100)
    finally:
        await conn.close()
    await insert_ranges(url, [("sync1", "r", "caches", "persister1", 0, 2000)])


def _kernel_spec(root: Path) -> str:
    """A kernel spec pinned to this interpreter, in a private JUPYTER_PATH (no global registration)."""
    spec_dir = root / "kernels" / "fanout-audit-test"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fanout audit test",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return "fanout-audit-test"


def test_notebook_executes(servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_name = _kernel_spec(tmp_path / "jupyter")
    out = tmp_path / "report"
    with scratch_database(servers) as url:
        asyncio.run(_small_log(url))
        monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
        monkeypatch.setenv("FANOUT_AUDIT_DATABASE_URL", url)
        monkeypatch.setenv("FANOUT_AUDIT_OUT", str(out))
        monkeypatch.setenv("FANOUT_SPARK_MASTER", "local[2]")
        monkeypatch.setenv("FANOUT_SPARK_CONF", "spark.sql.shuffle.partitions=4,spark.ui.enabled=false")
        notebook = nbformat.read(NOTEBOOK, as_version=4)
        NotebookClient(
            notebook, kernel_name=kernel_name, timeout=240, resources={"metadata": {"path": tmp_path}}
        ).execute()
    texts = [
        o.get("text", "") + json.dumps(o.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for o in cell.outputs
    ]
    assert any("reconciliation ok: True" in t for t in texts)
    images = [
        o
        for cell in notebook.cells
        if cell.cell_type == "code"
        for o in cell.outputs
        if "image/png" in o.get("data", {})
    ]
    assert len(images) == 3  # volume over time, savings and hottest caches, applied vs missed
    summary = json.loads((out / "summary.json").read_text())
    # 2000 rows: i % 10 == 0 are batched (200 rows of 4 keys), i % 100 == 98 have keys NULL (20 rows).
    assert summary["totals"]["rows"] == 2000
    assert (summary["totals"]["batched_rows"], summary["totals"]["invalidate_all_rows"]) == (200, 20)
    assert summary["totals"]["keys"] == 200 * 4 + (2000 - 200 - 20)
    assert (out / "report.md").exists()
