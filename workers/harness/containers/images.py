"""The stack's images, built on the base made here (`base.py`) with `docker build`.

Each build passes the base as the Dockerfile's BASE argument and uses the host's network (see
`engine.py`), with the host's proxy variables when it has any. The engine's layer cache keys each
step by its instruction and the content it copies, so a run whose inputs did not change rebuilds
nothing; `Built.cached` says whether the image is the one that was there before.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from workers.harness.containers.base import image_size
from workers.harness.containers.commands import docker, run, run_logged

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


@dataclass(frozen=True)
class ImageSpec:
    """One image of docker-compose.debian.yml: its tag, build context (relative to the repository)
    and Dockerfile (relative to the context)."""

    role: str
    tag: str
    dockerfile: str
    context: str


#: The images docker-compose.debian.yml names, in build order.
IMAGES = (
    ImageSpec("worker", "fanout-worker:bookworm", "compose/Dockerfile", "."),
    ImageSpec("postgres", "fanout-postgres:15-bookworm", "Dockerfile", "compose/debian/postgres"),
    ImageSpec("redis", "fanout-redis:7.0-bookworm", "Dockerfile", "compose/debian/redis"),
    ImageSpec("audit", "fanout-audit:bookworm", "compose/Dockerfile.audit", "."),
)  # fmt: skip


@dataclass(frozen=True)
class Built:
    spec: ImageSpec
    seconds: float
    size_bytes: int
    cached: bool


def image_id(tag: str) -> str | None:
    result = run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], check=False, timeout=30)
    return result.stdout.strip() if result.returncode == 0 else None


def build(spec: ImageSpec, base: str, repo: Path, log: Path) -> Built:
    """Build `spec` on `base`; its `Step n/m` lines are shown as progress."""
    before = image_id(spec.tag)
    args = ["--build-arg", f"BASE={base}"]
    args += [a for name in PROXY_VARIABLES if os.environ.get(name) for a in ("--build-arg", name)]
    started = time.monotonic()
    run_logged(
        ["docker", "build", "--network", "host", "-f", str(repo / spec.context / spec.dockerfile), *args,
         "-t", spec.tag, str(repo / spec.context)],
        log, progress=lambda line: line.startswith("Step ") and not _trivial(line),
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )  # fmt: skip
    seconds = time.monotonic() - started
    return Built(spec, seconds, image_size(spec.tag), image_id(spec.tag) == before)


def _trivial(step: str) -> bool:
    """Steps not worth a progress line: they take no time."""
    instruction = step.split(" : ", 1)[-1].split(" ", 1)[0].upper()
    return instruction in {"ENV", "WORKDIR", "USER", "ENTRYPOINT", "CMD", "HEALTHCHECK", "EXPOSE", "ARG",
                           "STOPSIGNAL", "FROM"}  # fmt: skip


def user_of(tag: str) -> str:
    return docker("image", "inspect", "-f", "{{.Config.User}}", tag)
