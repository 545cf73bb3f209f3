"""A local cluster of real worker processes, for the demo, the benchmarks and the cluster tests.

Each worker is `python -m workers.cli worker --config <file>` with its own YAML file, log file and
free HTTP port, started with PR_SET_PDEATHSIG so none outlives the launcher. `start()` returns once
every worker's /health says ready. Roles: persisters write the events stream, sync workers serve
reads, background workers run their tasks; every worker serves the whole client API (a client may
talk to any of them). A worker's `command` may be another install's `fanout` (the upgrade check
runs the previous release's beside this tree's). `write_only_persisters=True` makes the persisters
`serve_reads: false`, as a deployment that keeps clients' reads off its writers would.
`redis_cluster` (node URLs) puts the workers on a Redis Cluster with sharded pub/sub, each stream
on its own channel. `reload()` rewrites the running workers' configurations (a persister added to
or taken from `workers`, or its `writes_events` changed) and SIGHUPs them, as an operator would.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from workers.embedded.services import child_setup, free_port
from workers.errors import WorkerError
from workers.process.startup_errors import PORT_BUSY


class ClusterError(WorkerError):
    """A worker of the local cluster did not start, answer or stop as expected."""


@dataclass
class WorkerSpec:
    name: str
    writes_events: bool = False
    background_tasks: list[str] = field(default_factory=list)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    #: The `fanout` command it runs; None: this interpreter's `python -m workers.cli` (the code under
    #: test). Another install's `<venv>/bin/fanout` runs that install's code: its environment has
    #: no PYTHONPATH and its working directory is the cluster's, so nothing of this tree leaks in.
    command: list[str] | None = None


#: The loopback networks: a local cluster's own clients.
LOOPBACK = ["127.0.0.0/8", "::1/128"]
#: The start of a worker's stderr line when its HTTP port is bound already.
_PORT_BUSY = PORT_BUSY.encode()
#: Starts of a whole cluster, when a port was taken by another process in between.
START_ATTEMPTS = 3


class LocalCluster:
    def __init__(
        self,
        database_url: str,
        redis_url: str,
        workdir: Path,
        *,
        persisters: int = 2,
        sync_workers: int = 2,
        background_workers: int = 1,
        channel_prefix: str = "fanout",
        announce_interval_s: float = 1.0,
        extra_config: dict[str, Any] | None = None,
        log_level: str = "INFO",
        stream_writers: dict[str, list[str]] | None = None,
        write_only_persisters: bool = False,
        worker_config: dict[str, dict[str, Any]] | None = None,
        redis_cluster: Sequence[str] = (),
        registration: str | None = "open",
        cpu_profile: Path | None = None,
    ) -> None:
        #: Where the workers' CPU profiles go: each worker of this tree's code then runs under
        #: `workers.harness.bench.cpu_sampler` (recording between SIGUSR1 and SIGUSR2).
        self.cpu_profile = cpu_profile
        #: The workers' registration policy (None: their default, closed).
        self.registration = registration
        self.write_only_persisters = write_only_persisters
        #: Per worker, settings over everything else (e.g. one worker's Redis through a fault proxy).
        self.worker_config = worker_config or {}
        self.database_url = database_url
        self.redis_url = redis_url
        #: A Redis Cluster's node URLs: the workers then use it, with sharded pub/sub on per-stream channels.
        self.redis_cluster = list(redis_cluster)
        self.workdir = workdir
        self.channel_prefix = channel_prefix
        self.announce_interval_s = announce_interval_s
        self.extra_config = extra_config or {}
        self.log_level = log_level
        #: Writers of the other streams (typing, presence, ...), beside the persisters' events.
        self.stream_writers = stream_writers or {}
        self.worker_secret = secrets.token_hex(16)
        self.workers: dict[str, WorkerSpec] = {}
        for i in range(1, persisters + 1):
            self.workers[f"persister{i}"] = WorkerSpec(f"persister{i}", writes_events=True)
        for i in range(1, sync_workers + 1):
            self.workers[f"sync{i}"] = WorkerSpec(f"sync{i}")
        for i in range(1, background_workers + 1):
            self.workers[f"background{i}"] = WorkerSpec(
                f"background{i}", background_tasks=["room_stats", "federation_sender"]
            )
        self.workdir.mkdir(parents=True, exist_ok=True)

    @property
    def event_writers(self) -> list[str]:
        return [w.name for w in self.workers.values() if w.writes_events]

    @property
    def sync_workers(self) -> list[str]:
        return [w.name for w in self.workers.values() if w.name.startswith("sync")]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.workers[name].port}"

    @property
    def urls(self) -> dict[str, str]:
        return {name: self.url(name) for name in self.workers}

    @property
    def pids(self) -> dict[str, int]:
        """Each running worker's process id, by name."""
        return {name: spec.process.pid for name, spec in self.workers.items() if spec.process is not None}

    def config_path(self, name: str) -> Path:
        return self.workdir / f"{name}.yaml"

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def _write_config(self, spec: WorkerSpec) -> None:
        for other in self.workers.values():  # every URL is known before any worker starts
            if other.port == 0:
                other.port = free_port()
        config = {
            "instance_name": spec.name,
            "database_url": self.database_url,
            "redis_url": self.redis_url,
            **self._cluster_settings(),
            "channel_prefix": self.channel_prefix,
            "stream_writers": {"events": self.event_writers, **self.stream_writers},
            "instance_map": self.urls,
            "worker_secret": self.worker_secret,
            "http_host": "127.0.0.1",
            "http_port": spec.port,
            "position_announce_interval_s": self.announce_interval_s,
            "background_tasks": spec.background_tasks,
            "serve_reads": not (spec.writes_events and self.write_only_persisters),
            "log_level": self.log_level,
            # A local test cluster: its loopback clients (the load generator and the tests, many
            # users from one address) are not rate limited.
            **({} if self.registration is None else {"registration": self.registration}),
            "rc_exempt_addresses": LOOPBACK,
            **self.extra_config,
            **self.worker_config.get(spec.name, {}),
        }
        self.config_path(spec.name).write_text(yaml.safe_dump(config, sort_keys=False))

    def _cluster_settings(self) -> dict[str, Any]:
        if not self.redis_cluster:
            return {}
        return {"redis_cluster": self.redis_cluster, "sharded_pubsub": True, "per_stream_channels": True}

    def _spawn(self, spec: WorkerSpec) -> None:
        self._write_config(spec)
        log = open(self.log_path(spec.name), "ab")  # handed to the child
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if spec.command is not None:
            env.pop("PYTHONPATH", None)
        command = spec.command or [sys.executable, "-m", "workers.cli"]
        if spec.command is None and self.cpu_profile is not None:
            sampler = "workers.harness.bench.cpu_sampler"
            command = [sys.executable, "-m", sampler, str(self.cpu_profile), spec.name, "--"]
        spec.process = subprocess.Popen(
            [*command, "worker", "--config", str(self.config_path(spec.name))],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=child_setup(None, None, signal.SIGTERM),
            env=env,
            cwd=self.workdir if spec.command is not None else None,
        )  # fmt: skip
        log.close()

    async def start(self, names: list[str] | None = None, timeout_s: float = 60.0) -> None:
        """Start the named workers (default: all, persisters first) and wait until each is ready.

        Starting the whole cluster, a worker whose port another process bound between the pick
        and the bind (`fanout: HTTP port busy`) makes every worker start again on new ports
        (twice at most): the ports are in every worker's `instance_map`."""
        chosen = [self.workers[n] for n in (names or list(self.workers))]
        for attempt in range(1, START_ATTEMPTS + 1):
            marks = {s.name: self._log_size(s.name) for s in chosen}
            for spec in chosen:
                self._spawn(spec)
            try:
                await self.wait_ready([s.name for s in chosen], timeout_s)
                return
            except ClusterError:
                busy = [s.name for s in chosen if _PORT_BUSY in self._log_since(s.name, marks[s.name])]
                if attempt == START_ATTEMPTS or not busy or len(chosen) != len(self.workers):
                    raise
                print(f"{', '.join(busy)}: port taken by another process; starting again on new ports",
                      file=sys.stderr)  # fmt: skip
                for spec in chosen:
                    self.kill(spec.name)
                    spec.port = 0

    def _log_size(self, name: str) -> int:
        try:
            return self.log_path(name).stat().st_size
        except OSError:
            return 0

    async def wait_ready(self, names: list[str], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            for name in names:
                while not await self._ready(session, name):
                    spec = self.workers[name]
                    if spec.process is not None and spec.process.poll() is not None:
                        raise ClusterError(
                            f"{name} exited with {spec.process.returncode}:\n{self.log_tail(name)}"
                        )
                    if time.monotonic() > deadline:
                        raise ClusterError(f"{name} not ready after {timeout_s:.0f}s:\n{self.log_tail(name)}")
                    await asyncio.sleep(0.1)

    async def _ready(self, session: aiohttp.ClientSession, name: str) -> bool:
        """Ready, and this cluster's process: a worker of another cluster that took the port
        first (its own worker then exits, port busy) must not pass for it. A worker of a release
        that did not report its pid yet (the upgrade check's) is taken at its word."""
        process = self.workers[name].process
        try:
            async with session.get(
                f"{self.url(name)}/health", timeout=aiohttp.ClientTimeout(total=2)
            ) as resp:
                if resp.status != 200:
                    return False
                body = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        if process is None or not isinstance(body, dict):
            return True
        return bool(body.get("pid", process.pid) == process.pid)

    async def health(self, name: str) -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.get(f"{self.url(name)}/health") as resp:
            result: dict[str, Any] = await resp.json()
            return result

    def kill(self, name: str) -> None:
        """SIGKILL, no clean-up: what a crash looks like."""
        spec = self.workers[name]
        if spec.process is not None and spec.process.poll() is None:
            spec.process.kill()
            spec.process.wait()

    async def reload(self, timeout_s: float = 15.0) -> None:
        """Write every running worker's configuration again (the events writers are the workers
        with `writes_events`, the instance map every worker) and SIGHUP it; return once each has
        logged that it applied the change (`workers.assembly.reload`)."""
        running = [s for s in self.workers.values() if s.process is not None and s.process.poll() is None]
        marks = {}
        for spec in running:
            self._write_config(spec)
            marks[spec.name] = self.log_path(spec.name).stat().st_size
            assert spec.process is not None
            spec.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout_s
        for spec in running:
            while b"config reload: " not in self._log_since(spec.name, marks[spec.name]):
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{spec.name} did not apply its new configuration:\n{self.log_tail(spec.name)}"
                    )
                await asyncio.sleep(0.05)

    def _log_since(self, name: str, offset: int) -> bytes:
        try:
            with open(self.log_path(name), "rb") as log:
                log.seek(offset)
                return log.read()
        except OSError:
            return b""

    async def restart(self, name: str, timeout_s: float = 60.0) -> None:
        self.kill(name)
        await self.start([name], timeout_s)

    async def stop(self, timeout_s: float = 30.0, names: list[str] | None = None) -> dict[str, int | None]:
        """SIGTERM the named workers (default: all; sync and background first, persisters last) and
        wait for them; returns their exit codes."""
        chosen = [self.workers[n] for n in names] if names is not None else list(self.workers.values())
        order = sorted(chosen, key=lambda s: s.writes_events)
        for spec in order:
            if spec.process is not None and spec.process.poll() is None:
                spec.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int | None] = {}
        for spec in order:
            if spec.process is None:
                continue
            while spec.process.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            if spec.process.poll() is None:
                spec.process.kill()
                spec.process.wait()
            codes[spec.name] = spec.process.returncode
        return codes

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
