"""The release bookkeeping agrees with itself: one version (pyproject, printed by `fanout --version`),
a CHANGELOG entry for it, and `release/previous.toml` naming an older release whose commit holds
that version, with tests/compat recorded from it."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
PREVIOUS = tomllib.loads((ROOT / "release" / "previous.toml").read_text())


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_fanout_version_prints_the_pyproject_version() -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "fanout"), "--version"], capture_output=True, text=True
    )
    assert (result.returncode, result.stdout) == (0, f"fanout {VERSION}\n")


def test_the_changelog_has_an_entry_for_this_version() -> None:
    headings = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert headings and headings[0].split()[1] == VERSION, headings[:1]


def test_the_previous_release_is_older_and_its_commit_holds_its_version() -> None:
    assert set(PREVIOUS) == {"version", "commit"}
    if not PREVIOUS["version"]:  # this version is the first release
        assert PREVIOUS["commit"] == ""
        return
    assert Version(PREVIOUS["version"]) < Version(VERSION)
    shown = _git("show", f"{PREVIOUS['commit']}:pyproject.toml")
    assert shown.returncode == 0, shown.stderr
    assert tomllib.loads(shown.stdout)["project"]["version"] == PREVIOUS["version"]


def test_a_tagged_version_has_moved_on() -> None:
    """Once `v<version>` is tagged, any later change carries the next version (and names the
    tag's commit in release/previous.toml)."""
    tagged = _git("rev-parse", "--verify", "--quiet", f"v{VERSION}^{{commit}}").stdout.strip()
    if not tagged:
        return  # not tagged (yet), or a checkout without tags
    assert _git("diff", "--quiet", tagged, "HEAD").returncode == 0, (
        f"v{VERSION} is tagged at {tagged[:12]} and HEAD differs: bump pyproject.toml's version and"
        " name that commit in release/previous.toml"
    )


def test_the_compat_fixtures_come_from_the_previous_release() -> None:
    recorded = json.loads((ROOT / "tests" / "compat" / "tokens.json").read_text())["release"]
    assert recorded == (PREVIOUS["version"] or VERSION)
