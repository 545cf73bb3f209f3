"""Synapse's configuration for the peer run: a main process, two event persisters and a sync worker.

`write_config(layout)` writes into `layout.workdir` the shared `homeserver.yaml` (the main
process's), one `<worker>.yaml` per worker, a logging file and the signing key (made by the
venv's own `generate_signing_key`). Everything listens on loopback ports chosen here:

* main: a client listener (registration, rooms, sends: Synapse's main process creates events and
  hands them to the persisters over HTTP replication) and a replication listener;
* persister1, persister2: replication listeners only; `stream_writers: events` names both;
* sync1: a client listener, which the driver's /sync requests go to (the routing a reverse proxy
  would do, done by the driver: no proxy in the path).

`instance_map` holds main and the persisters (whoever is reached over replication); Redis is
enabled on the shared server. What is changed from Synapse's defaults, and why:

* every `rc_*` rate limit is raised out of the way (10^6 per second, same burst): the driver is
  many users from one address sending back to back, which Synapse would otherwise throttle;
* registration is open without verification (`m.login.dummy`), with `bcrypt_rounds: 4` so that
  setting up users is quick (it is not measured);
* no federation (no federation listener, an empty `federation_domain_whitelist`, no federation
  sender), no trusted key servers, no URL previews, no metrics, logging at WARNING.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workers.embedded.services import free_port
from workers.harness.upgrade_build import release_env

HOST = "127.0.0.1"
SERVER_NAME = "peer.localhost"
PERSISTERS = ("persister1", "persister2")
SYNC_WORKER = "sync1"
WORKERS = (*PERSISTERS, SYNC_WORKER)
#: A rate that never binds (Synapse's limiter takes any float).
UNLIMITED = {"per_second": 1_000_000, "burst_count": 1_000_000}
RATE_LIMITS: dict[str, Any] = {
    "rc_message": UNLIMITED,
    "rc_registration": UNLIMITED,
    "rc_registration_token_validity": UNLIMITED,
    "rc_login": {"address": UNLIMITED, "account": UNLIMITED, "failed_attempts": UNLIMITED},
    "rc_joins": {"local": UNLIMITED, "remote": UNLIMITED},
    "rc_joins_per_room": UNLIMITED,
    "rc_room_creation": UNLIMITED,
    "rc_invites": {"per_room": UNLIMITED, "per_user": UNLIMITED, "per_issuer": UNLIMITED},
    "rc_3pid_validation": UNLIMITED,
    "rc_admin_redaction": UNLIMITED,
    "rc_presence": {"per_user": UNLIMITED},
    "rc_delayed_event_mgmt": UNLIMITED,
    "rc_reports": UNLIMITED,
}


@dataclass
class SynapseLayout:
    """Where Synapse's files go and which ports its processes listen on (chosen at creation)."""

    workdir: Path
    database: str
    postgres_port: int
    redis_port: int
    client_ports: dict[str, int] = field(default_factory=dict)
    replication_ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.client_ports = self.client_ports or {"main": free_port(), SYNC_WORKER: free_port()}
        self.replication_ports = self.replication_ports or {n: free_port() for n in ("main", *PERSISTERS)}

    @property
    def homeserver(self) -> Path:
        return self.workdir / "homeserver.yaml"

    def worker_file(self, name: str) -> Path:
        return self.workdir / f"{name}.yaml"

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def health_url(self, name: str) -> str:
        """A URL of `name`'s that answers 200 once it serves (every Synapse listener has /health)."""
        port = self.client_ports.get(name) or self.replication_ports[name]
        return f"http://{HOST}:{port}/health"

    def client_url(self, name: str) -> str:
        return f"http://{HOST}:{self.client_ports[name]}"


def _listener(port: int, resource: str) -> dict[str, Any]:
    return {
        "port": port,
        "bind_addresses": [HOST],
        "type": "http",
        "tls": False,
        "x_forwarded": False,
        "resources": [{"names": [resource], "compress": False}],
    }


def _listeners(layout: SynapseLayout, name: str) -> list[dict[str, Any]]:
    found = []
    if name in layout.client_ports:
        found.append(_listener(layout.client_ports[name], "client"))
    if name in layout.replication_ports:
        found.append(_listener(layout.replication_ports[name], "replication"))
    return found


def _log_config(layout: SynapseLayout, name: str) -> Path:
    path = layout.workdir / f"{name}.log.yaml"
    config = {
        "version": 1,
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": str(layout.log_path(name)),
                "formatter": "plain",
            }
        },
        "root": {"level": "WARNING", "handlers": ["file"]},
        "disable_existing_loggers": False,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def homeserver_config(layout: SynapseLayout) -> dict[str, Any]:
    """The main process's configuration (the workers read it too, then their own file)."""
    return {
        "server_name": SERVER_NAME,
        "pid_file": str(layout.workdir / "homeserver.pid"),
        "report_stats": False,
        "signing_key_path": str(layout.workdir / "signing.key"),
        "log_config": str(_log_config(layout, "main")),
        "media_store_path": str(layout.workdir / "media"),
        "macaroon_secret_key": secrets.token_hex(16),
        "form_secret": secrets.token_hex(16),
        "registration_shared_secret": secrets.token_hex(16),
        "worker_replication_secret": secrets.token_hex(16),
        "enable_registration": True,
        "enable_registration_without_verification": True,
        "bcrypt_rounds": 4,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "federation_sender_instances": [],
        "url_preview_enabled": False,
        "enable_metrics": False,
        "listeners": _listeners(layout, "main"),
        "database": {
            "name": "psycopg2",
            "args": {
                "user": "postgres",
                "database": layout.database,
                "host": HOST,
                "port": layout.postgres_port,
                "cp_min": 5,
                "cp_max": 10,
            },
        },
        "redis": {"enabled": True, "host": HOST, "port": layout.redis_port},
        "instance_map": {n: {"host": HOST, "port": p} for n, p in layout.replication_ports.items()},
        "stream_writers": {"events": list(PERSISTERS)},
        **RATE_LIMITS,
    }


def worker_config(layout: SynapseLayout, name: str) -> dict[str, Any]:
    """A worker's own file (read after homeserver.yaml)."""
    return {
        "worker_app": "synapse.app.generic_worker",
        "worker_name": name,
        "worker_listeners": _listeners(layout, name),
        "worker_log_config": str(_log_config(layout, name)),
    }


def write_config(layout: SynapseLayout, python: Path) -> None:
    """Write every file Synapse's processes read; the signing key with the venv's `python`."""
    layout.workdir.mkdir(parents=True, exist_ok=True)
    layout.homeserver.write_text(yaml.safe_dump(homeserver_config(layout), sort_keys=False))
    for name in WORKERS:
        layout.worker_file(name).write_text(yaml.safe_dump(worker_config(layout, name), sort_keys=False))
    key = layout.workdir / "signing.key"
    if not key.exists():
        subprocess.run(
            [str(python), "-m", "synapse._scripts.generate_signing_key", "-o", str(key)],
            check=True, env=release_env(), capture_output=True,
        )  # fmt: skip
