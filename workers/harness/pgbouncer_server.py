"""A throw-away PgBouncer in transaction mode in front of a PostgreSQL, on a free loopback port.

Tests run the cluster through it as an operator would run it (docs/operations.md, Capacity):
`pool_mode = transaction`, every database of the server reachable under its own name (the `*`
entry), clients let in without a password (`auth_type = any`: each server login uses the user,
and password, of the PostgreSQL URL it was given), a server pool smaller than what the clients
open, so that server connections are really shared. The binary is Debian's `pgbouncer`
(`make pgbouncer` installs it) or `PGBOUNCER_BIN`.

PgBouncer refuses to run as root; as root it runs as `nobody`, from a directory of its own that
`nobody` can read (the caller's temporary directories often cannot be traversed).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from workers.embedded.services import RunningServer, ServiceError, child_setup, free_port

_START_TIMEOUT_S = 30.0
#: The PgBouncer user allowed on its admin console (`SHOW POOLS`).
ADMIN_USER = "pgbouncer_admin"


def pgbouncer_bin() -> Path:
    """PGBOUNCER_BIN, else `pgbouncer` on PATH or in /usr/sbin (where Debian puts it)."""
    if env := os.environ.get("PGBOUNCER_BIN"):
        return Path(env)
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if found is None:
        raise ServiceError("no `pgbouncer`: run `make pgbouncer` (Debian's pgbouncer) or set PGBOUNCER_BIN")
    return Path(found)


@dataclass
class PgBouncer:
    """A running PgBouncer: `url(database)` reaches a database through it; `stop()` ends it."""

    server: RunningServer
    port: int
    user: str
    directory: Path
    pool_size: int

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def through(self, database_url: str) -> str:
        """`database_url` (a database of the server behind) reached through this PgBouncer."""
        return self.url(urlsplit(database_url).path.lstrip("/"))

    def show(self, what: str) -> list[dict[str, str | None]]:
        """`SHOW what` on the admin console (POOLS, CLIENTS, SERVERS, CONFIG...), one dict per row.
        The console speaks only the simple query protocol, which asyncpg does not offer."""
        return simple_query(self.port, ADMIN_USER, "pgbouncer", f"SHOW {what}")

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def simple_query(port: int, user: str, database: str, sql: str) -> list[dict[str, str | None]]:
    """`sql` over PostgreSQL's simple query protocol on 127.0.0.1:`port`, for a server that lets
    `user` in without a password (PgBouncer's console here); the rows as text."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        params = f"user\0{user}\0database\0{database}\0\0".encode()
        sock.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
        reader = sock.makefile("rb")

        def message() -> tuple[bytes, bytes]:
            kind, length = struct.unpack("!ci", reader.read(5))
            return kind, reader.read(length - 4)

        def until_ready() -> Iterator[tuple[bytes, bytes]]:
            while (got := message())[0] != b"Z":
                if got[0] == b"E":
                    fields = dict((f[:1], f[1:].decode()) for f in got[1].split(b"\0") if f)
                    raise ServiceError(f"{sql!r} on port {port}: {fields.get(b'M', got[1])}")
                if got[0] == b"R" and struct.unpack_from("!i", got[1])[0] != 0:
                    raise ServiceError(f"port {port} asks {user} for a password")
                yield got

        list(until_ready())
        query = sql.encode() + b"\0"
        sock.sendall(b"Q" + struct.pack("!i", 4 + len(query)) + query)
        names: list[str] = []
        rows: list[dict[str, str | None]] = []
        for kind, body in until_ready():
            if kind == b"T":
                (count,), at = struct.unpack_from("!h", body), 2
                for _ in range(count):
                    end = body.index(b"\0", at)
                    names.append(body[at:end].decode())
                    at = end + 1 + 18  # table oid, column, type oid, size, modifier, format
            elif kind == b"D":
                (count,), at = struct.unpack_from("!h", body), 2
                values: list[str | None] = []
                for _ in range(count):
                    (size,) = struct.unpack_from("!i", body, at)
                    at += 4
                    values.append(None if size < 0 else body[at : at + size].decode())
                    at += max(size, 0)
                rows.append(dict(zip(names, values, strict=True)))
        sock.sendall(b"X" + struct.pack("!i", 4))
        return rows


def _ini(postgres_url: str, port: int, pool_size: int) -> str:
    target = urlsplit(postgres_url)
    login = f"user={unquote(target.username or 'postgres')}"
    if target.password:
        login += f" password={unquote(target.password)}"
    return f"""[databases]
* = host={target.hostname or "127.0.0.1"} port={target.port or 5432} {login}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
admin_users = {ADMIN_USER}
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
max_db_connections = {pool_size}
ignore_startup_parameters = extra_float_digits
"""


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def start_pgbouncer(postgres_url: str, *, pool_size: int = 4) -> PgBouncer:
    """Start PgBouncer in transaction mode in front of the server of `postgres_url` (TCP; its user
    and password are the logins PgBouncer uses), with at most `pool_size` server connections per
    database; returns once it accepts connections."""
    binary = pgbouncer_bin()
    directory = Path(tempfile.mkdtemp(prefix="fanout-pgbouncer-"))
    directory.chmod(0o755)
    uid = gid = None
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        uid, gid = nobody.pw_uid, nobody.pw_gid
    for attempt in range(3):
        port = free_port()
        ini = directory / "pgbouncer.ini"
        ini.write_text(_ini(postgres_url, port, pool_size))
        ini.chmod(0o644)
        log_path = directory / "pgbouncer.log"
        out = open(log_path, "ab")
        process = subprocess.Popen(
            [str(binary), "-q", str(ini)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=directory, preexec_fn=child_setup(uid, gid, signal.SIGTERM),
        )  # fmt: skip
        out.close()
        url = f"postgresql://127.0.0.1:{port}"
        server = RunningServer("pgbouncer", process, url, log_path, signal.SIGTERM)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _answers(port):
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                break
            time.sleep(0.05)
        else:
            return PgBouncer(server, port, "postgres", directory, pool_size)
        tail = server.log_tail()
        if attempt == 2 or "in use" not in tail:
            shutil.rmtree(directory, ignore_errors=True)
            raise ServiceError(f"pgbouncer did not start ({process.returncode}):\n{tail}")
    raise AssertionError("unreachable")
