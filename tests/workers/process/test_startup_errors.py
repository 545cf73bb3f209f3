"""Every row of the start-up failure table: `fanout worker` as a real process, one line, one code.

Each case writes a configuration (and environment) with one thing wrong and runs the installed
command; stderr must hold the expected line and no traceback, and the exit status must match
workers/process/startup_errors.py (2: change the configuration; 1: a runtime condition).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.workers.worker_process import FANOUT, start_worker
from workers.embedded.services import free_port


def _config(database_url: str, redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "instance_name": "w1",
        "database_url": database_url,
        "redis_url": redis_url,
        "channel_prefix": prefix,
        "stream_writers": {"events": ["w1"]},
        "http_port": 0,
        "startup_retry_s": 1,
        "event_loop": "asyncio",
    }


def _yaml(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on for the test's duration."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.fixture
def http_server_port() -> Iterator[int]:
    """A real server that is not Redis (Python's http.server) listening on a free port."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "http.server did not start"
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(10)


def _with_url(field: str, make_url: Callable[[str, int], str]) -> Case:
    """Set `field` to `make_url(the good value, port)`."""
    return lambda config, port: (_yaml({**config, field: make_url(config[field], port)}), {})


def _credentials(url: str, userinfo: str) -> str:
    return url.replace("://", f"://{userinfo}@", 1)


# case -> (edit of the good config as YAML text or None, extra env, expected text, exit code)
Case = Callable[[dict[str, Any], int], tuple[str | None, dict[str, str]]]


def _set(**fields: Any) -> Case:
    return lambda config, _port: (_yaml({**config, **fields}), {})


def _drop(field: str) -> Case:
    return lambda config, _port: (_yaml({k: v for k, v in config.items() if k != field}), {})


CASES: dict[str, tuple[Case, str, int]] = {
    "unreadable file": (lambda c, p: (None, {}), "cannot read configuration file", 2),
    "bad YAML": (lambda c, p: ("instance_name: [unclosed\n", {}), "is not valid YAML", 2),
    "duplicate key": (
        lambda c, p: (
            "http_port: 0\nhttp_port: 9\n" + _yaml({k: v for k, v in c.items() if k != "http_port"}),
            {},
        ),
        "duplicate key 'http_port' at line 2",
        2,
    ),
    "unknown field": (_set(http_prot=1), "field 'http_prot': unknown field", 2),
    "missing field": (_drop("redis_url"), "field 'redis_url': Field required", 2),
    "bad value": (_set(db_pool_size=0), "field 'db_pool_size'", 2),
    "port out of range": (_set(http_port=70000), "field 'http_port'", 2),
    "malformed env value": (
        lambda c, p: (_yaml(c), {"FANOUT_STREAM_WRITERS": "notjson"}),
        "environment variable FANOUT_STREAM_WRITERS is malformed",
        2,
    ),
    "malformed IPv6 database URL": (
        _set(database_url="postgresql://u@[::1:5432/db"),
        "malformed URL: Invalid IPv6 URL",
        2,
    ),
    "Redis URL port out of range": (
        _set(redis_url="redis://127.0.0.1:99999/0"),
        "field 'redis_url': Value error, malformed URL: port '99999' is not a number in 1-65535",
        2,
    ),
    "Redis password, server has none": (
        _with_url("redis_url", lambda url, _p: _credentials(url, ":not-configured")),
        "credentials refused: AUTH <password> called without any password configured",
        2,
    ),
    "Redis user and password refused": (
        _with_url("redis_url", lambda url, _p: _credentials(url, "nobody:wrong")),
        "credentials refused: invalid username-password pair",
        2,
    ),
    "not a Redis server": (
        _with_url("redis_url", lambda _url, port: f"redis://127.0.0.1:{port}/0"),
        "Redis at 127.0.0.1:{port}: not a Redis server: Protocol error",
        2,
    ),
    "no such database": (
        _with_url("database_url", lambda url, _p: url.rpartition("/")[0] + "/no_such_db"),
        'database "no_such_db" does not exist (create it, or fix database_url)',
        2,
    ),
    "PostgreSQL login refused": (
        _with_url("database_url", lambda url, _p: url.replace("://postgres@", "://no_such_role@", 1)),
        'login refused: role "no_such_role" does not exist',
        2,
    ),
    "no writer for events": (_set(stream_writers={}), "names no writer of the 'events' stream", 2),
    "pooler without a direct URL": (
        _set(database_pooler="transaction"),
        "database_pooler: transaction needs database_direct_url",
        2,
    ),
    "direct URL without a pooler": (
        lambda c, _p: (_yaml({**c, "database_direct_url": c["database_url"]}), {}),
        "database_direct_url is used only with database_pooler: transaction",
        2,
    ),
    # database_url and database_direct_url swapped: the "direct" one is a real PgBouncer.
    "direct URL through a pooler": (
        lambda c, p: (_yaml(c), {}),
        "database_direct_url (127.0.0.1:{port}) reaches a connection pooler, not PostgreSQL itself",
        2,
    ),
    "postgres unreachable": (
        lambda c, p: (_yaml({**c, "database_url": f"postgresql://u@127.0.0.1:{p}/db"}), {}),
        "PostgreSQL at 127.0.0.1:{port} unreachable after 1s",
        1,
    ),
    "redis unreachable": (
        lambda c, p: (_yaml({**c, "redis_url": f"redis://127.0.0.1:{p}"}), {}),
        "Redis at 127.0.0.1:{port} unreachable after 1s",
        1,
    ),
    "Redis never answers": (  # a listening socket that nobody reads
        lambda c, p: (_yaml({**c, "redis_url": f"redis://127.0.0.1:{p}"}), {}),
        "Redis at 127.0.0.1:{port} unreachable after 1s: no answer",
        1,
    ),
    "busy HTTP port": (lambda c, p: (_yaml({**c, "http_port": p}), {}), "HTTP port busy", 1),
    # A real worker holds the name first (see _holder).
    "instance name held": (lambda c, p: (_yaml(c), {}), "instance name 'w1' (prefix ", 1),
}


@contextlib.contextmanager
def _holder(case: str, config: dict[str, Any], tmp_path: Path) -> Iterator[None]:
    if case != "instance name held":
        yield
        return
    process = start_worker(config, tmp_path / "holder.yaml")
    try:
        yield
    finally:
        process.terminate()
        process.wait(30)


@pytest.mark.parametrize("case", list(CASES))
async def test_startup_failure_is_one_line_and_a_code(
    case: str,
    database_url: str,
    redis_url: str,
    channel_prefix: str,
    busy_port: int,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    make, expected, code = CASES[case]
    port = busy_port if case in ("busy HTTP port", "Redis never answers") else free_port()
    if case == "not a Redis server":
        port = request.getfixturevalue("http_server_port")
    config = _config(database_url, redis_url, channel_prefix)
    if case == "direct URL through a pooler":
        bouncer = request.getfixturevalue("pgbouncer")
        port = bouncer.port
        config |= {"database_pooler": "transaction", "database_direct_url": bouncer.through(database_url)}
    text, env = make(config, port)
    path = tmp_path / "worker.yaml"
    if text is not None:
        path.write_text(text)
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    with _holder(case, config, tmp_path):
        result = await asyncio.to_thread(
            subprocess.run,
            [FANOUT, "worker", "--config", str(path)],
            env={**clean_env, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == code, result.stderr
    if code == 2:  # a configuration error is never retried
        assert "retrying" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    failure_lines = [line for line in result.stderr.splitlines() if line.startswith("fanout: ")]
    assert len(failure_lines) == 1, result.stderr
    assert expected.format(port=port) in result.stderr, result.stderr
