"""One process per instance name: a PostgreSQL session advisory lock held on a dedicated connection.

`InstanceLease.acquire()` takes the lock on a hash of (channel_prefix, instance_name) or raises
`NameHeld` naming the holder (pid and host, from `instance_leases`). The lock lives as long as its
connection. That connection runs with `idle_session_timeout = lease_s` and is touched every
lease_s / 3: a process frozen (SIGSTOP) or cut off for longer than `lease_s` loses its session, so
Postgres releases the name and another process may take it. The holder learns of the loss at its
next touch and takes the lock again on a new session: that works when nobody took the name meanwhile
(PostgreSQL restarted, the link was cut), and the process goes on. When another process holds the
name now (this one was frozen or cut off past the lease), or PostgreSQL stays unreachable for the
retake window, it calls `on_lost`; the worker then refuses requests and exits 1, so a process that
lost its name never keeps writing once it runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from workers.startup_errors import NameHeld

log = logging.getLogger(__name__)


class InstanceLease:
    """The held name; `release()` gives it back (also safe after a loss)."""

    #: Called with (name, seconds) after each keep-alive statement (None: not timed).
    timed: Callable[[str, float], None] | None = None

    def __init__(
        self,
        conn: asyncpg.Connection[Any],
        database_url: str,
        key: str,
        lease_s: float,
        retake_s: float,
        on_lost: Callable[[], None],
    ):
        self._conn = conn
        self._database_url = database_url
        self.key = key
        self._lease_s = lease_s
        self._retake_s = retake_s
        self._on_lost = on_lost
        self.lost = False
        self.retaken = 0
        self._task = asyncio.create_task(self._keep(), name=f"lease:{key}")

    @classmethod
    async def acquire(
        cls,
        database_url: str,
        prefix: str,
        name: str,
        lease_s: float,
        on_lost: Callable[[], None],
        retake_s: float = 30.0,
    ) -> InstanceLease:
        """Hold the name, or raise `NameHeld` saying who holds it."""
        key = f"{prefix}/{name}"
        return cls(await _take(database_url, key, lease_s), database_url, key, lease_s, retake_s, on_lost)

    async def _keep(self) -> None:
        while True:
            try:
                while True:
                    await asyncio.sleep(self._lease_s / 3)
                    started = time.perf_counter()
                    await asyncio.wait_for(self._conn.fetchval("SELECT 1"), self._lease_s / 3)
                    if self.timed is not None:
                        self.timed(f"{__name__}.InstanceLease._keep", time.perf_counter() - started)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the session, and with it the name, may be gone
                log.warning(
                    "instance lease %s: session lost (%s); taking the name again",
                    self.key,
                    e or type(e).__name__,
                )
                self._conn.terminate()
            if not await self._retake():
                self.lost = True
                self._on_lost()
                return

    async def _retake(self) -> bool:
        """Take the lock again on a new session: True once held again. Nobody else can have taken
        the name while PostgreSQL was unreachable; if someone did once it came back (this process
        was frozen or cut off past the lease), the name is theirs: False. False too when PostgreSQL
        stays unreachable for `retake_s`."""
        deadline = asyncio.get_running_loop().time() + self._retake_s
        while True:
            try:
                self._conn = await _take(self._database_url, self.key, self._lease_s)
            except NameHeld as e:
                log.error("instance lease %s lost: %s; stopping", self.key, e)
                return False
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
                if asyncio.get_running_loop().time() >= deadline:
                    log.error("instance lease %s lost: PostgreSQL unreachable for %.0fs (%s); stopping",
                              self.key, self._retake_s, e)  # fmt: skip
                    return False
                await asyncio.sleep(min(1.0, self._lease_s / 3))
                continue
            self.retaken += 1
            log.info("instance lease %s held again", self.key)
            return True

    async def release(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if not self.lost:
            with contextlib.suppress(Exception):
                await self._conn.execute(
                    "DELETE FROM instance_leases WHERE lease_key = $1 AND pid = $2", self.key, os.getpid()
                )
        self._conn.terminate() if self.lost else await self._conn.close()


async def _take(database_url: str, key: str, lease_s: float) -> asyncpg.Connection[Any]:
    """A session holding the name's lock, or `NameHeld` saying who holds it."""
    timeout_ms = str(int(lease_s * 1000))
    conn = await asyncpg.connect(
        database_url, server_settings={"idle_session_timeout": timeout_ms}, timeout=max(1.0, lease_s / 3)
    )
    try:
        got = await conn.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, 0))", key)
        if not got:
            row = await conn.fetchrow(
                "SELECT pid, host, since FROM instance_leases WHERE lease_key = $1", key
            )
            holder = (
                f"pid {row['pid']} on {row['host']} since {row['since']:%Y-%m-%d %H:%M:%S}"
                if row
                else "another process"
            )
            prefix, _, name = key.rpartition("/")
            raise NameHeld(f"instance name {name!r} (prefix {prefix!r}) is held by {holder}")
        await conn.execute(
            "INSERT INTO instance_leases (lease_key, pid, host) VALUES ($1, $2, $3)"
            " ON CONFLICT (lease_key) DO UPDATE SET pid = $2, host = $3, since = now()",
            key, os.getpid(), socket.gethostname(),
        )  # fmt: skip
    except BaseException:
        await conn.close()  # the lock (if taken) goes with the session
        raise
    return conn
