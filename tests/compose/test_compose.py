"""compose/: no Docker engine here, so check what can be checked for real: the file's structure, the
Dockerfile's inputs, and every worker's configuration running a real worker against the test servers."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from workers.app import Worker
from workers.config import load_config

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
WORKERS = ["persister1", "persister2", "sync", "background1"]
PROFILED = {"audit", "prometheus", "grafana"}


def _services() -> dict[str, Any]:
    document = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    services: dict[str, Any] = document["services"]
    return services


def _host_side(mapping: str) -> str:
    """The host side of a port mapping, a `${VAR:-default}` at its default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", mapping).rsplit(":", 1)[0]


def test_compose_file_describes_the_cluster() -> None:
    services = _services()
    assert set(services) == {"postgres", "redis", *WORKERS, *PROFILED}
    assert all(services[name]["profiles"] for name in PROFILED)  # only when asked for
    host_ports = [_host_side(p) for s in services.values() for p in s.get("ports", [])]
    assert "-" in _host_side(services["sync"]["ports"][0])  # a range: `--scale sync=N` fits
    assert len(host_ports) == len(set(host_ports))
    for name in WORKERS:
        service = services[name]
        mount = service["volumes"][0].split(":")
        assert mount[0] == f"./config/{name}.yaml" and mount[1] == "/etc/fanout/worker.yaml"
        assert (COMPOSE / mount[0]).exists()
        assert (
            "FANOUT_DATABASE_URL" in service["environment"]
            and "/health" in service["healthcheck"]["test"][-1]
        )
        # Every worker can forward a room write to any persister: all URLs, one secret.
        assert json.loads(service["environment"]["FANOUT_INSTANCE_MAP"]) == {
            w: f"http://{w}:8080" for w in WORKERS if w != "sync"
        }
        assert len(service["environment"]["FANOUT_WORKER_SECRET"]) >= 16
    repo = COMPOSE.parent
    for line in (COMPOSE / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (repo / source).exists(), source


@pytest.mark.parametrize(("name", "hostname"), [(w, f"{w}-host") for w in WORKERS] + [("sync", "replica-2")])
async def test_each_worker_configuration_runs(
    name: str,
    hostname: str,
    database_url: str,
    redis_url: str,
    channel_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each service's config and environment run a worker; the `sync` service twice, as two
    replicas (two hostnames) of `--scale sync=2`, under distinct instance names."""
    environment = _services()[name]["environment"]
    for key, value in environment.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.setenv("HOSTNAME", hostname)  # what Docker gives each container
    config = load_config(COMPOSE / "config" / f"{name}.yaml")
    assert config.instance_name == (f"sync-{hostname}" if name == "sync" else name)
    assert config.writers_of("events") == ["persister1", "persister2"]
    # Point the same file at the test's servers and a free port, as compose points it at its own.
    monkeypatch.setenv("FANOUT_DATABASE_URL", database_url)
    monkeypatch.setenv("FANOUT_REDIS_URL", redis_url)
    monkeypatch.setenv("FANOUT_HTTP_PORT", "0")
    monkeypatch.setenv("FANOUT_HTTP_HOST", "127.0.0.1")
    monkeypatch.setenv("FANOUT_CHANNEL_PREFIX", channel_prefix)
    monkeypatch.setenv("FANOUT_POSITION_ANNOUNCE_INTERVAL_S", "0.1")
    worker = Worker(load_config(COMPOSE / "config" / f"{name}.yaml"))
    await worker.start()
    try:
        ready, detail = worker.health()
        assert ready, detail
        assert (worker.persister is not None) == name.startswith("persister")
        assert (worker.room_stats is not None) == (name == "background1")
    finally:
        await worker.stop()


def test_compose_tooling_accepts_the_file() -> None:
    """The real Compose implementation parses and validates the file (`make docker-compose`)."""
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE / "docker-compose.yml"), "config", "-q"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_redis_confines_the_workers_to_the_prefix() -> None:
    redis = _services()["redis"]
    command = redis["command"]
    user = command[command.index("fanout") : command.index("--client-output-buffer-limit")]
    assert {"resetkeys", "~fanout:*", "resetchannels", "&fanout:*"} <= set(user)
    assert command[command.index("default") + 1] == "off"
    assert command[command.index("--client-output-buffer-limit") + 1] == "pubsub"
    for name in WORKERS:
        assert _services()[name]["environment"]["FANOUT_REDIS_URL"].startswith("redis://fanout:")
