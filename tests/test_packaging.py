"""The lock file pins every runtime dependency inside pyproject's bounds; the version has one
source (pyproject, read back through the installed metadata); every package ships py.typed."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def _locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_the_lock_pins_every_runtime_dependency_within_its_bounds() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _locked()
    for text in project["dependencies"]:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        upper = [spec for spec in requirement.specifier if spec.operator in ("<", "<=", "==", "~=")]
        assert upper, f"{text}: no upper bound (bound it to the versions we test)"
        locked = pins[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(locked), f"{requirement.name}=={locked} outside {text}"


def test_the_version_has_one_source() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert importlib.metadata.version("fanout") == project["version"]


def test_every_package_is_typed_and_licensed() -> None:
    for package in ("idgen", "pubsub", "workers", "analytics"):
        assert (ROOT / package / "py.typed").exists(), package
    assert "Apache License" in (ROOT / "LICENSE").read_text()
