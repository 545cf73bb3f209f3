"""The Docker engine of the run: the one that answers, or a `dockerd` started here and stopped after.

This machine reaches no image registry and its kernel takes no iptables rules from the engine, so
dockerd runs with `--iptables=false`: containers on a Compose network still reach each other by
name (the engine's own DNS) and the published ports still answer on the host (docker-proxy), but a
container on a bridge reaches nothing outside. Image builds therefore use the host's network.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from workers.harness.containers.commands import StepFailed, run

#: What dockerd is started with when none runs (see the module's docstring).
DOCKERD_ARGS = ("--iptables=false",)
PIDFILE = Path("/var/run/docker.pid")


@dataclass(frozen=True)
class Engine:
    """The engine's version, and the dockerd process this run started (None: one was running)."""

    version: str
    started: subprocess.Popen[bytes] | None


def answers() -> str | None:
    """The engine's version when one answers the `docker` client, else None."""
    if shutil.which("docker") is None:
        raise StepFailed("the docker client is not installed (make docker-compose installs docker.io)")
    result = run(["docker", "version", "--format", "{{.Server.Version}}"], timeout=20, check=False)
    return result.stdout.strip() or None if result.returncode == 0 else None


def _stale_pidfile() -> None:
    """Remove dockerd's pid file when its process is gone (a dockerd that was killed leaves it)."""
    try:
        pid = int(PIDFILE.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        PIDFILE.unlink(missing_ok=True)


@contextlib.contextmanager
def engine(log: Path, wait_s: float = 60) -> Iterator[Engine]:
    """The running engine, or `dockerd` started (as root) for the block and stopped after it.
    No engine and no way to start one raises `StepFailed` with the reason."""
    version = answers()
    if version is not None:
        yield Engine(version, None)
        return
    if shutil.which("dockerd") is None:
        raise StepFailed("no Docker engine answers and dockerd is not installed (make docker-compose)")
    if os.geteuid() != 0:
        raise StepFailed("no Docker engine answers, and starting dockerd takes root")
    _stale_pidfile()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            ["dockerd", *DOCKERD_ARGS], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + wait_s
        while (version := answers()) is None:
            if process.poll() is not None:
                raise StepFailed(f"dockerd exited {process.returncode} at start (its log: {log})")
            if time.monotonic() > deadline:
                raise StepFailed(f"dockerd did not answer within {wait_s:g}s (its log: {log})")
            time.sleep(0.5)
        yield Engine(version, process)
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s: dockerd stops its containerd and the containers it runs."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
