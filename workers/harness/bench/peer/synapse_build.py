"""Synapse, the peer, built into a virtualenv of its own: never a dependency of this project.

`build_synapse()` installs `matrix-synapse[postgres,redis]==VERSION` (pinned) with pip into
`.cache/synapse-peer/<VERSION>/venv` of the source checkout (git-ignored), as the upgrade check
builds the previous release (`workers.harness.upgrade_build`). A stamp in the venv records the
requirement and the interpreter; a venv whose stamp matches is reused, any other is rebuilt. A file
lock serializes builds (two test processes may ask at once). The build is checked by importing
`synapse` in the venv, whose installed distribution must be VERSION. A failed build raises
`BuildError`, whose text is one line saying why (pip's last lines) and what to do.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from workers.harness.upgrade_build import SOURCE_ROOT, BuildError, Say, build_lock, release_env

VERSION = "1.163.2"
REQUIREMENT = f"matrix-synapse[postgres,redis]=={VERSION}"
#: Where builds live, under the source checkout.
CACHE = SOURCE_ROOT / ".cache" / "synapse-peer"


@dataclass(frozen=True, slots=True)
class SynapseVenv:
    """A built Synapse: `python` runs its code (`-m synapse.app.homeserver`, ...)."""

    venv: Path
    reused: bool
    seconds: float

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


#: Imports Synapse (so a broken install fails here) and prints its installed distribution's version.
_VERSION_CHECK = "import importlib.metadata, synapse; print(importlib.metadata.version('matrix-synapse'))"


def _stamp() -> dict[str, str]:
    return {"requirement": REQUIREMENT, "python": sys.version, "base": sys.base_prefix}


def venv_path(cache: Path = CACHE) -> Path:
    """Where the venv of VERSION is (or would be) built."""
    return cache / VERSION / "venv"


def is_built(cache: Path = CACHE) -> bool:
    """Whether a reusable build is there (its stamp matches this interpreter)."""
    stamp = venv_path(cache) / ".fanout-build.json"
    try:
        return bool(json.loads(stamp.read_text()) == _stamp())
    except (OSError, ValueError):
        return False


def _run(argv: list[str], what: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, env=release_env())
    if result.returncode != 0:
        lines = [x for x in (result.stderr or result.stdout).strip().splitlines() if "WARNING" not in x]
        raise BuildError(
            f"{what} failed (exit {result.returncode}): {' | '.join(lines[-3:])}"
            " (needs PyPI or pip's cache; a C compiler and libpq for psycopg2)"
        )
    return result.stdout


def build_synapse(cache: Path = CACHE, say: Say = print) -> SynapseVenv:
    """Build (or reuse) the venv of matrix-synapse VERSION; progress goes to `say`."""
    started = time.monotonic()
    venv = venv_path(cache)
    with build_lock(cache / f"{VERSION}.lock"):
        if is_built(cache):
            say(f"Synapse {VERSION}: reusing {venv}")
            return _checked(SynapseVenv(venv, True, time.monotonic() - started))
        say(f"Synapse {VERSION}: building {venv} (pip install {REQUIREMENT}; a few minutes the first time)")
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], "python -m venv")
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run([*pip, REQUIREMENT], f"pip install {REQUIREMENT}")
        (venv / ".fanout-build.json").write_text(json.dumps(_stamp()))
        built = _checked(SynapseVenv(venv, False, time.monotonic() - started))
        say(f"  built in {built.seconds:.0f}s")
        return built


def _checked(built: SynapseVenv) -> SynapseVenv:
    """The venv's own `synapse` must be VERSION (it is what the peer runs)."""
    printed = _run([str(built.python), "-c", _VERSION_CHECK], "import synapse")
    if printed.strip() != VERSION:
        raise BuildError(
            f"{built.venv} holds Synapse {printed.strip()!r}, not {VERSION}: delete it to rebuild"
        )
    return built
