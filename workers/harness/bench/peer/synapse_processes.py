"""Synapse's processes for the peer run: started on the layout `synapse_config` wrote, stopped after.

`SynapsePeer.start()` starts the main process first and waits for its /health (on a new database
it creates the schema, which the workers refuse to start without), then the two persisters and
the sync worker, and returns once each answers /health. Each process runs the venv's Python with
this tree's PYTHONPATH removed, its working directory the layout's, PR_SET_PDEATHSIG set so none
outlives the launcher. `stop()` sends SIGTERM (then SIGKILL after a grace period) and waits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import aiohttp

from workers.embedded.services import child_setup
from workers.errors import WorkerError
from workers.harness.bench.peer.synapse_config import SYNC_WORKER, WORKERS, SynapseLayout, write_config
from workers.harness.upgrade_build import release_env


class SynapseError(WorkerError):
    """A Synapse process did not start or answer; the text ends with its log's last lines."""


class SynapsePeer:
    """Synapse main + persister1 + persister2 + sync1 on `layout`, run by the venv's `python`."""

    def __init__(self, python: Path, layout: SynapseLayout) -> None:
        self.python = python
        self.layout = layout
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        write_config(layout, python)

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.processes.items()}

    @property
    def main_url(self) -> str:
        return self.layout.client_url("main")

    @property
    def sync_url(self) -> str:
        return self.layout.client_url(SYNC_WORKER)

    def _spawn(self, name: str) -> None:
        app = "synapse.app.homeserver" if name == "main" else "synapse.app.generic_worker"
        config = ["--config-path", str(self.layout.homeserver)]
        if name != "main":
            config += ["--config-path", str(self.layout.worker_file(name))]
        out = open(self.layout.workdir / f"{name}.out", "ab")  # handed to the child
        self.processes[name] = subprocess.Popen(
            [str(self.python), "-m", app, *config],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.layout.workdir,
            env=release_env(),
            preexec_fn=child_setup(None, None, signal.SIGTERM),
        )  # fmt: skip
        out.close()

    async def start(self, timeout_s: float = 180.0) -> None:
        """Start main, then the workers; return once all four answer /health."""
        deadline = time.monotonic() + timeout_s
        self._spawn("main")
        await self._wait_healthy(["main"], deadline)
        for name in WORKERS:
            self._spawn(name)
        await self._wait_healthy(list(WORKERS), deadline)

    async def _wait_healthy(self, names: list[str], deadline: float) -> None:
        async with aiohttp.ClientSession() as http:
            for name in names:
                while not await _answers(http, self.layout.health_url(name)):
                    process = self.processes[name]
                    if process.poll() is not None:
                        raise SynapseError(
                            f"Synapse {name} exited with {process.returncode}: {self._tail(name)}"
                        )
                    if time.monotonic() > deadline:
                        raise SynapseError(f"Synapse {name} not healthy in time: {self._tail(name)}")
                    await asyncio.sleep(0.2)

    def _tail(self, name: str, lines: int = 8) -> str:
        text = ""
        for path in (self.layout.workdir / f"{name}.out", self.layout.log_path(name)):
            if path.exists():
                text += path.read_text(errors="replace")
        return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"

    async def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the workers, then main; SIGKILL whatever is left after `grace_s`."""
        order = [n for n in (*WORKERS, "main") if n in self.processes]
        for name in order:
            if self.processes[name].poll() is None:
                self.processes[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name in order:
            process = self.processes[name]
            while process.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()


async def _answers(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
