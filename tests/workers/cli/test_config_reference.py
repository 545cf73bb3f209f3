"""docs/configuration.md is the settings model's own output, and `--check` notices when it is not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from workers.cli import config_reference
from workers.config import WorkerConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_configuration_md_is_current() -> None:
    assert DOC.read_text() == config_reference.render(), (
        "docs/configuration.md is stale: run fanout config-reference --write docs/configuration.md"
    )


def test_every_setting_is_documented_with_a_meaning() -> None:
    text = config_reference.render()
    for name, field in WorkerConfig.model_fields.items():
        assert f"| `{name}` |" in text
        assert field.description, f"setting {name} has no description"


def test_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(config_reference.render().replace("Logging threshold", "old words"))
    run = [sys.executable, "-m", "workers.cli", "config-reference", "--check", str(stale)]
    done = subprocess.run(run, capture_output=True, text=True)
    assert done.returncode == 1 and "out of date" in done.stderr and "Traceback" not in done.stderr
    subprocess.run([*run[:-2], "--write", str(stale)], check=True)
    assert subprocess.run(run, capture_output=True).returncode == 0
