"""One Compose project of the stack: compose/docker-compose.yml with docker-compose.debian.yml and
the run's own file, on free loopback ports, reached through its published ports.

The run's file (`run.yml` in the run's directory) publishes PostgreSQL on a loopback port for the
history check and opens registration through the environment (the load registers its users as
`fanout demo` does). The workers' published ports are the ordinary file's `*_PUBLISH` variables,
set to free loopback ports chosen here, fixed for the run so that a restarted container answers
where it did before.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from workers.harness.containers.commands import StepFailed, run, say

WORKERS = ("persister1", "persister2", "sync", "background1")
SERVICES = ("postgres", "redis", *WORKERS)
SYNC_REPLICAS = 2
CREDENTIALS = "fanout:fanout"  # the ordinary file's database and Redis user
#: The engine's default address pools: the load generator's requests reach a worker from the
#: gateway of the project's network, somewhere in these.
ENGINE_NETWORKS = ["172.16.0.0/12", "192.168.0.0/16"]


@dataclass(frozen=True)
class Container:
    id: str
    service: str
    number: int

    @property
    def name(self) -> str:
        """The name the run uses: the service, or `sync-N` for the Nth sync replica."""
        return f"{self.service}-{self.number}" if self.service == "sync" else self.service


def free_port(pairs: bool = False) -> int:
    """A free loopback port (with `pairs`, one whose next port is free too)."""
    while True:
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            if not pairs:
                return port
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port


class Stack:
    """The project `project` of the stack, its files and ports; `down` removes it with its volumes."""

    def __init__(self, repo: Path, workdir: Path, project: str) -> None:
        self.repo = repo
        self.workdir = workdir
        self.project = project
        self.postgres_port = free_port()
        sync = free_port(pairs=True)
        self.published = {
            "PERSISTER1_PUBLISH": f"127.0.0.1:{free_port()}",
            "PERSISTER2_PUBLISH": f"127.0.0.1:{free_port()}",
            "SYNC_PUBLISH": f"127.0.0.1:{sync}-{sync + SYNC_REPLICAS - 1}",
        }
        run_file = workdir / "run.yml"
        run_file.write_text(_run_file(self.postgres_port))
        compose = repo / "compose"
        self.files = [compose / "docker-compose.yml", compose / "docker-compose.debian.yml", run_file]
        self.env = {**os.environ, **self.published, "COMPOSE_PROJECT_NAME": project}

    @property
    def database_url(self) -> str:
        return f"postgresql://{CREDENTIALS}@127.0.0.1:{self.postgres_port}/fanout"

    def command(self, *args: str) -> list[str]:
        """The docker-compose command line of this project, as a user would type it."""
        files = [a for f in self.files for a in ("-f", str(f))]
        return ["docker-compose", "-p", self.project, *files, *args]

    def compose(
        self, *args: str, timeout: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return run(self.command(*args), env=self.env, timeout=timeout, check=check)

    def up(self) -> None:
        self.compose("up", "-d", "--no-build", "--scale", f"sync={SYNC_REPLICAS}")

    def stop(self) -> None:
        self.compose("stop", timeout=120)

    def down(self) -> None:
        """Remove the project's containers, network and volumes (never fails: it is the cleanup)."""
        self.compose("--profile", "audit", "down", "-v", "--remove-orphans", "--timeout", "5", timeout=180,
                     check=False)  # fmt: skip

    def containers(self) -> list[Container]:
        labels = '{{.Label "com.docker.compose.service"}}\t{{.Label "com.docker.compose.container-number"}}'
        out = run(
            ["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}", "--format",
             "{{.ID}}\t" + labels],
        ).stdout  # fmt: skip
        found = []
        for line in out.splitlines():
            cid, service, number = line.split("\t")
            if service in SERVICES:
                found.append(Container(cid, service, int(number or 1)))
        return sorted(found, key=lambda c: (SERVICES.index(c.service), c.number))

    def container(self, name: str) -> Container:
        for c in self.containers():
            if c.name == name:
                return c
        raise StepFailed(f"no container {name} in project {self.project}")

    def inspect(self, container: Container, template: str) -> str:
        return run(["docker", "inspect", "-f", template, container.id]).stdout.strip()

    def urls(self) -> dict[str, str]:
        """Worker name -> base URL on its published port (the persisters and each sync replica)."""
        urls: dict[str, str] = {}
        for c in self.containers():
            if c.service in ("persister1", "persister2", "sync"):
                port = self.compose("port", f"--index={c.number}", c.service, "8080").stdout.strip()
                if not port:
                    raise StepFailed(f"{c.name} publishes no port")
                urls[c.name] = f"http://{port}"
        return urls

    def wait_healthy(self, timeout_s: float = 180, names: list[str] | None = None) -> float:
        """Wait until every container (or those named) reports healthy; the seconds it took. The
        states are shown as they change; a timeout saves the unhealthy ones' logs and fails."""
        started = time.monotonic()
        shown = ""
        while True:
            wanted = [c for c in self.containers() if names is None or c.name in names]
            states = {c.name: self.inspect(c, "{{if .State.Health}}{{.State.Health.Status}}{{else}}"
                                           "{{.State.Status}}{{end}}") for c in wanted}  # fmt: skip
            healthy = sum(s == "healthy" for s in states.values())
            line = f"{healthy}/{len(states)} healthy" + "".join(
                f", {n} {s}" for n, s in states.items() if s != "healthy"
            )
            if line != shown:
                print(f"    {time.monotonic() - started:5.1f}s  {line}", flush=True)
                shown = line
            if states and healthy == len(states):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                for c in wanted:
                    if states[c.name] != "healthy":
                        self.save_logs(c)
                raise StepFailed(f"not healthy after {timeout_s:g}s: {line} (logs in {self.workdir})")
            time.sleep(0.5)

    def save_logs(self, container: Container) -> Path:
        path = self.workdir / f"{container.name}.log"
        result = run(["docker", "logs", "--timestamps", container.id], check=False, timeout=60)
        path.write_text(result.stdout + result.stderr)
        return path

    def crash(self, container: Container) -> None:
        """SIGKILL the container's process from the host, as a crash or the kernel's OOM killer
        would: the engine sees it die and applies the restart policy. (`docker kill` would not
        show that: the engine takes it for a stop asked by the operator, which the policy obeys.)"""
        pid = int(self.inspect(container, "{{.State.Pid}}"))
        if pid <= 0:
            raise StepFailed(f"{container.name} is not running")
        os.kill(pid, signal.SIGKILL)

    def restarts(self, container: Container) -> int:
        return int(self.inspect(container, "{{.RestartCount}}"))

    def finished_at(self, container: Container) -> datetime.datetime:
        text = self.inspect(container, "{{.State.FinishedAt}}")
        head, _, rest = text.rstrip("Z").partition(".")
        return datetime.datetime.fromisoformat(f"{head}.{(rest + '000000')[:6]}+00:00")


def _run_file(postgres_port: int) -> str:
    environment = (
        "    environment:\n      FANOUT_REGISTRATION: open\n"
        f"      FANOUT_RC_EXEMPT_ADDRESSES: '{json.dumps(ENGINE_NETWORKS)}'\n"
    )
    workers = "".join(f"  {name}:\n{environment}" for name in WORKERS)
    return (
        "# Written by make containers (workers/harness/containers/stack.py) for one run: PostgreSQL on a\n"
        "# loopback port for the history check; registration open and no rate limit for the load\n"
        "# generator (its requests come from the network's gateway), as `fanout demo` has them.\n"
        f'services:\n  postgres:\n    ports: ["127.0.0.1:{postgres_port}:5432"]\n{workers}'
    )


def announce(stack: Stack) -> None:
    say(f"compose project {stack.project}: {' '.join(stack.command('up', '-d'))}")
