"""What an image and a running container of the stack promise, checked on the real thing.

An image: a non-root user, no compiler, none of the project's test dependencies (its `dev`
extra). A running worker: its process is not root, every line it logs is a JSON object on stdout, and its
configuration is the mounted file's with the environment's settings over it (the instance name
from the file, `sync-{hostname}` for a replica; registration, database and Redis from the
environment). Each check returns the problems it found (none: the promise holds) and a figure.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from workers.harness.containers.commands import run
from workers.harness.containers.stack import Container, Stack

#: What a build toolchain would leave behind.
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "tcc", "ld", "make")


@dataclass
class Finding:
    """A check's figure (what it saw) and its problems."""

    figure: str
    problems: list[str] = field(default_factory=list)


def dev_dependencies(repo: Path) -> list[str]:
    """The distributions of the project's `dev` extra (the test and lint tools)."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    names = []
    for requirement in project["optional-dependencies"]["dev"]:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        if match:
            names.append(match.group(0))
    return names


def image_holds_nothing_extra(tag: str, repo: Path) -> Finding:
    """No compiler on PATH, no distribution of the `dev` extra installed, a non-root user."""
    problems: list[str] = []
    user = run(["docker", "image", "inspect", "-f", "{{.Config.User}}", tag]).stdout.strip()
    if user in ("", "root", "0") or user.startswith(("0:", "root:")):
        problems.append(f"{tag} runs as root (USER {user or 'unset'})")
    script = "for c in " + " ".join(COMPILERS) + '; do command -v "$c" || true; done'
    compilers = run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", tag, "-c", script])
    found = compilers.stdout.split()
    if found:
        problems.append(f"{tag} holds a compiler or build tool: {', '.join(found)}")
    dev = dev_dependencies(repo)
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "found = []\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    try:\n        m.distribution(name)\n        found.append(name)\n"
        "    except m.PackageNotFoundError:\n        pass\n"
        "print(json.dumps(found))\n"
    )
    installed = run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", tag, "-c", probe,
                     json.dumps(dev)])  # fmt: skip
    test_deps = json.loads(installed.stdout)
    if test_deps:
        problems.append(f"{tag} holds test dependencies: {', '.join(test_deps)}")
    figure = (f"user {user or 'root'}, compilers {', '.join(found) or 'none'}, test dependencies"
              f" {', '.join(test_deps) or 'none'} (of {len(dev)} in the dev extra)")  # fmt: skip
    return Finding(figure, problems)


def runs_unprivileged(stack: Stack, container: Container) -> Finding:
    """The container's main process (PID 1 in it) has a non-zero user id."""
    status = run(["docker", "exec", container.id, "cat", "/proc/1/status"]).stdout
    uid = next((line.split()[1] for line in status.splitlines() if line.startswith("Uid:")), "?")
    problems = [] if uid not in ("0", "?") else [f"{container.name}'s process runs as uid {uid}"]
    return Finding(f"uid {uid}", problems)


def logs_are_json(container: Container) -> Finding:
    """Every line the container wrote is a JSON object with a level and a message, on stdout
    (`docker logs` keeps the two streams apart): nothing on stderr."""
    result = run(["docker", "logs", container.id], timeout=60)
    problems: list[str] = []
    counts = {"stdout": 0, "stderr": 0}
    for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        for line in text.splitlines():
            if not line.strip():
                continue
            counts[stream] += 1
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict) or not {"level", "message"} <= record.keys():
                if len(problems) < 3:
                    problems.append(f"{container.name} logged a line that is no JSON record: {line[:120]}")
    if counts["stderr"] or not counts["stdout"]:
        problems.append(f"{container.name}: {counts['stdout']} lines on stdout, {counts['stderr']} on stderr")
    return Finding(f"{counts['stdout']} lines on stdout, {counts['stderr']} on stderr", problems)


def configured_from_file_and_environment(stack: Stack, container: Container) -> Finding:
    """`fanout check-config` inside the container resolves the mounted file with the environment
    over it: the file's instance name (a replica's from its hostname), the environment's
    registration, database and Redis."""
    resolved = json.loads(
        run(["docker", "exec", container.id, "fanout", "check-config", "/etc/fanout/worker.yaml"]).stdout
    )
    hostname = stack.inspect(container, "{{.Config.Hostname}}")
    expected = {
        "instance_name": f"sync-{hostname}" if container.service == "sync" else container.service,
        "registration": "open",
        "http_host": "0.0.0.0",
    }
    problems = [
        f"{container.name}: {key} resolved to {resolved.get(key)!r}, expected {value!r}"
        for key, value in expected.items()
        if resolved.get(key) != value
    ]
    for key, host in (("database_url", "@postgres:5432/"), ("redis_url", "@redis:6379/")):
        if host not in str(resolved.get(key)):
            problems.append(f"{container.name}: {key} resolved to {resolved.get(key)!r}")
    figure = f"instance {resolved.get('instance_name')}, registration {resolved.get('registration')}"
    return Finding(figure, problems)
