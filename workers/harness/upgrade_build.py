"""The previous release, built for the upgrade check: its source from the commit
`release/previous.toml` names (not its tag: a clone may lack tags), in a virtualenv of its own.

The build lives in `.cache/upgrade-check/<commit>/` of the source checkout: `src/` (`git archive`
of the commit) and `venv/`. The venv gets the release's own `requirements.lock` (its pinned runtime
dependencies: no extras, so no PySpark; the workers need none) with `pip install --no-deps -r`,
then the release itself with `--no-deps`. A stamp in the venv records the commit, the lock's hash
and the interpreter; a venv whose stamp matches is reused, any other is rebuilt. A file lock
serializes builds of one commit (two test processes may ask at once). The release is checked by
running its `fanout --version`, which must print the version `previous.toml` names.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from workers.errors import WorkerError

Say = Callable[[str], None]
#: A source checkout's root: this file is <root>/workers/harness/upgrade_build.py.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_FILE = Path("release") / "previous.toml"
LOCK_FILE = "requirements.lock"


class BuildError(WorkerError):
    """The previous release cannot be built here; str(error) is one line saying why and what to do."""


@dataclass(frozen=True, slots=True)
class PreviousRelease:
    """A built previous release: `fanout` is its command (run it without PYTHONPATH)."""

    version: str
    commit: str
    venv: Path
    reused: bool
    seconds: float

    @property
    def fanout(self) -> Path:
        return self.venv / "bin" / "fanout"


def read_previous(root: Path) -> tuple[str, str]:
    """(version, commit) of the release `root`'s tree upgrades from."""
    path = root / PREVIOUS_FILE
    try:
        recorded = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise BuildError(
            f"no {PREVIOUS_FILE} under {root}: the upgrade check runs from a source checkout"
        ) from None
    version, commit = str(recorded.get("version", "")), str(recorded.get("commit", ""))
    if not version or not commit:
        raise BuildError(f"{path} names no previous release: this tree is the first release")
    return version, commit


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True)


def lock_changes(previous: str, current: str) -> str:
    """How HEAD's requirements.lock differs from the previous release's, in one line."""

    def pins(text: str) -> dict[str, str]:
        lines = (line.split("#")[0].strip() for line in text.splitlines())
        return dict(line.split("==", 1) for line in lines if "==" in line)

    old, new = pins(previous), pins(current)
    if old == new:
        return f"the same as HEAD's ({len(old)} pins)"
    changed = [f"{n} {old[n]} -> {new[n]}" for n in sorted(old.keys() & new.keys()) if old[n] != new[n]]
    parts = [f"HEAD adds {', '.join(sorted(new.keys() - old.keys()))}" if new.keys() - old.keys() else "",
             f"HEAD drops {', '.join(sorted(old.keys() - new.keys()))}" if old.keys() - new.keys() else "",
             f"changed: {', '.join(changed)}" if changed else ""]  # fmt: skip
    return f"{len(old)} pins, differing from HEAD's: " + "; ".join(p for p in parts if p)


@contextmanager
def build_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def release_env() -> dict[str, str]:
    """The environment another install's commands run in: this tree's PYTHONPATH removed."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(argv: list[str], what: str, cwd: Path | None = None) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, env=release_env(), cwd=cwd)
    if result.returncode != 0:
        tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
        raise BuildError(f"{what} failed (exit {result.returncode}): {tail}")
    return result.stdout


def build_previous_release(
    root: Path = SOURCE_ROOT, cache: Path | None = None, say: Say = print
) -> PreviousRelease:
    """Build (or reuse) the previous release of `root`'s tree; progress goes to `say`."""
    started = time.monotonic()
    version, commit = read_previous(root)
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise BuildError(
            f"the previous release {version}'s commit {commit[:12]} ({PREVIOUS_FILE}) is not in this"
            f" clone: fetch it (git fetch --unshallow, or git fetch origin {commit})"
        )
    home = (cache or root / ".cache" / "upgrade-check") / commit
    venv, src = home / "venv", home / "src"
    with build_lock(home.parent / f"{commit}.lock"):
        shown = _git(root, "show", f"{commit}:{LOCK_FILE}")
        lock = shown.stdout.decode() if shown.returncode == 0 else ""
        stamp = {"commit": commit, "lock_sha256": hashlib.sha256(lock.encode()).hexdigest(),
                 "python": sys.version, "base": sys.base_prefix}  # fmt: skip
        stamp_path = venv / ".fanout-build.json"
        if (
            stamp_path.exists()
            and json.loads(stamp_path.read_text()) == stamp
            and (venv / "bin/fanout").exists()
        ):
            say(f"previous release {version} ({commit[:12]}): reusing {venv}")
            return _checked(PreviousRelease(version, commit, venv, True, time.monotonic() - started))
        say(f"previous release {version} ({commit[:12]}): building in {home}")
        shutil.rmtree(home, ignore_errors=True)
        src.mkdir(parents=True)
        archive = _git(root, "archive", "--format=tar", commit)
        if archive.returncode != 0:
            raise BuildError(f"git archive {commit[:12]} failed: {archive.stderr.decode().strip()}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(src, filter="data")
        current = (root / LOCK_FILE).read_text() if (root / LOCK_FILE).exists() else ""
        compared = lock_changes(lock, current) if lock else "none (dependencies from its pyproject)"
        say(f"  its {LOCK_FILE}: {compared}")
        say("  creating the virtualenv")
        _run([sys.executable, "-m", "venv", str(venv)], "python -m venv")
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        if lock:
            (home / LOCK_FILE).write_text(lock)
            pins = sum(1 for line in lock.splitlines() if "==" in line)
            say(f"  installing its {pins} pinned dependencies (pip, from PyPI or pip's cache)")
            _run([*pip, "--no-deps", "-r", str(home / LOCK_FILE)], f"pip install -r {LOCK_FILE}")
            say(f"  installing fanout {version} itself (--no-deps)")
            _run([*pip, "--no-deps", str(src)], f"pip install fanout {version}")
        else:
            say(f"  installing fanout {version} with its dependencies")
            _run([*pip, str(src)], f"pip install fanout {version}")
        stamp_path.write_text(json.dumps(stamp))
        release = _checked(PreviousRelease(version, commit, venv, False, time.monotonic() - started))
        say(f"  built in {release.seconds:.1f}s")
        return release


def _checked(release: PreviousRelease) -> PreviousRelease:
    """The release's own `fanout --version` must name its version (the venv runs that code)."""
    printed = _run(
        [str(release.fanout), "--version"], f"{release.fanout} --version", cwd=release.venv
    ).strip()
    if printed != f"fanout {release.version}":
        raise BuildError(f"{release.fanout} prints {printed!r}, not 'fanout {release.version}'")
    return release
