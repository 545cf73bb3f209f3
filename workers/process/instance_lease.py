"""One process per instance name: a lease row with an epoch (fencing token), renewed by a heartbeat.

The name's row in `instance_leases` says who holds it (pid, host), until when (`expires_at`, the
database's clock) and under which `epoch`. A take is one statement: insert the row, or update it
when the lease expired, raising the epoch by one. No session state is involved, so it works through
a transaction-mode pooler (PgBouncer) as well as on a direct connection.

The holder renews `expires_at` every lease_s / 3 (`UPDATE ... WHERE epoch = mine`). A renewal that
finds another epoch means another process took the name (this one was frozen or cut off past the
lease): `on_lost` runs, and the worker refuses requests and exits 1. While PostgreSQL is
unreachable nobody can take the name, so the holder keeps trying; once it answers (a restart, a cut
link mended) the renewal succeeds under the same epoch and the process goes on (`retaken` counts
it). Unreachable for longer than `retake_s`, the holder gives up (`on_lost`).

Fencing: a holder's write checks the epoch inside its own transaction (`Fence.check`), taking a
KEY SHARE lock on the row. A take changes the epoch, a key column (the unique index on
(lease_key, epoch)), so it waits for the writes in flight and every write that starts after it
finds the new epoch and fails: a process that lost its name cannot commit, even when it runs again
before it notices. Renewals change only `expires_at` and never wait for the writes. A holder frozen
between the check and its COMMIT cannot hold a taker up for long: the check bounds the
transaction's idle time (`idle_in_transaction_session_timeout`) by the lease, so PostgreSQL ends it.

A holder on this host whose process is gone (it crashed; the restarted process sees its pid free)
loses the name at once rather than at expiry. Release (a clean stop) expires the row and keeps its
epoch, so a later taker's epoch is always higher than any earlier holder's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import asyncpg

from idgen.multi_writer import DATABASE_ERRORS
from pubsub.tasks import cancel_and_wait
from pubsub.ticks import sleep_to_next_run
from workers.errors import PersisterError
from workers.process.startup_errors import NameHeld
from workers.storage import Conn

log = logging.getLogger(__name__)

_TAKE = """
INSERT INTO instance_leases AS l (lease_key, pid, host, since, epoch, expires_at)
VALUES ($1, $2, $3, now(), 1, now() + make_interval(secs => $4))
ON CONFLICT (lease_key) DO UPDATE
SET pid = $2, host = $3, since = now(), epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= now() OR l.epoch = $5
RETURNING l.epoch
"""
_RENEW = (
    "UPDATE instance_leases SET expires_at = now() + make_interval(secs => $3)"
    " WHERE lease_key = $1 AND epoch = $2"
)
_RELEASE = "UPDATE instance_leases SET expires_at = now() WHERE lease_key = $1 AND epoch = $2"
_HOLDER = (
    "SELECT pid, host, since, epoch, greatest(0, extract(epoch FROM expires_at - now())) AS left_s"
    " FROM instance_leases WHERE lease_key = $1"
)


class LeaseLost(PersisterError):
    """This process no longer holds the lease its write needs: the write did not commit (503)."""


@dataclass(frozen=True, slots=True)
class Fence:
    """The lease a write must still hold when it commits: `key` under `epoch`."""

    key: str
    epoch: int
    #: The longest a checked transaction may sit idle (ms, as PostgreSQL takes it).
    idle_ms: str
    #: The check's statement ($1 the key, $2 `idle_ms`): the lease's epoch, locked until the
    #: transaction ends, and the transaction's idle time bounded.
    CHECK: ClassVar[str] = (
        "SELECT epoch, set_config('idle_in_transaction_session_timeout', $2, true)"
        " FROM instance_leases WHERE lease_key = $1 FOR KEY SHARE"
    )

    async def check(self, conn: Conn) -> None:
        """Inside the caller's transaction: raise `LeaseLost` unless the lease is still ours.
        Until the transaction ends, a take of the lease waits for it."""
        self.compare(await conn.fetchval(self.CHECK, self.key, self.idle_ms))

    def compare(self, held: int | None) -> None:
        """Raise `LeaseLost` unless `held` (the epoch `CHECK` read) is ours."""
        if held != self.epoch:
            raise LeaseLost(f"lease {self.key} is no longer held by this process (epoch {self.epoch})")


class InstanceLease:
    """The held name; `release()` gives it back (also safe after a loss)."""

    #: Called with (name, seconds) after each keep-alive statement (None: not timed).
    timed: Callable[[str, float], None] | None = None

    def __init__(
        self,
        conn: asyncpg.Connection[Any],
        database_url: str,
        key: str,
        epoch: int,
        lease_s: float,
        retake_s: float,
        on_lost: Callable[[], None],
    ):
        self._conn = conn
        self._database_url = database_url
        self.key = key
        self.fence = Fence(key, epoch, str(int(lease_s * 1000)))
        self._lease_s = lease_s
        self._retake_s = retake_s
        self._on_lost = on_lost
        self.lost = False
        self.retaken = 0
        self._task = asyncio.create_task(self._keep(), name=f"lease:{key}")

    @property
    def epoch(self) -> int:
        return self.fence.epoch

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
        conn = await _connect(database_url, lease_s)
        try:
            epoch = await take(conn, key, lease_s)
        except BaseException:
            await conn.close()
            raise
        return cls(conn, database_url, key, epoch, lease_s, retake_s, on_lost)

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        failing_since: float | None = None
        while True:
            await sleep_to_next_run(self._lease_s / 3)
            try:
                if self._conn.is_closed():
                    self._conn = await _connect(self._database_url, self._lease_s)
                started = time.perf_counter()
                status = await asyncio.wait_for(
                    self._conn.execute(_RENEW, self.key, self.fence.epoch, self._lease_s), self._lease_s / 3
                )
                if self.timed is not None:
                    self.timed(f"{__name__}.InstanceLease._keep", time.perf_counter() - started)
            except asyncio.CancelledError:
                raise
            except DATABASE_ERRORS as e:
                if failing_since is None:
                    failing_since = loop.time()
                    log.warning("instance lease %s: renewal failed (%s); trying again", self.key,
                                e or type(e).__name__)  # fmt: skip
                self._conn.terminate()
                if loop.time() - failing_since >= self._retake_s:
                    log.error("instance lease %s lost: PostgreSQL unreachable for %.0fs (%s); stopping",
                              self.key, self._retake_s, e)  # fmt: skip
                    return self._lose()
                continue
            if status != "UPDATE 1":
                log.error("instance lease %s lost: %s took it; stopping", self.key, await self._holder())
                return self._lose()
            if failing_since is not None:
                failing_since = None
                self.retaken += 1
                log.info("instance lease %s held again", self.key)

    def _lose(self) -> None:
        self.lost = True
        self._on_lost()

    async def _holder(self) -> str:
        with contextlib.suppress(Exception):
            return _describe(await self._conn.fetchrow(_HOLDER, self.key))
        return "another process"

    async def release(self) -> None:
        await cancel_and_wait(self._task)  # one cancel may be dropped by 3.11's wait_for
        if not self.lost:
            with contextlib.suppress(Exception):
                released = self._conn.execute(_RELEASE, self.key, self.fence.epoch)
                await asyncio.wait_for(released, min(self._lease_s, 3.0))
        if self.lost or self._conn.is_closed():
            self._conn.terminate()
            return
        try:
            await self._conn.close(timeout=min(self._lease_s, 3.0))
        except Exception:  # a renewal cancelled mid-statement left it busy, or the server is gone
            self._conn.terminate()


async def _connect(database_url: str, lease_s: float) -> asyncpg.Connection[Any]:
    # No statement cache: a transaction-mode pooler may hand each statement another backend.
    return await asyncpg.connect(database_url, statement_cache_size=0, timeout=max(1.0, lease_s / 3))


async def take(conn: Conn, key: str, lease_s: float) -> int:
    """Take the lease `key` for this process: its new epoch, or `NameHeld` saying who holds it.
    A holder on this host whose process is gone loses it at once."""
    me, host = os.getpid(), socket.gethostname()
    epoch = await conn.fetchval(_TAKE, key, me, host, lease_s, -1)
    if epoch is None:
        row = await conn.fetchrow(_HOLDER, key)
        if row is not None and row["host"] == host and not _alive(row["pid"]):
            log.info("instance lease %s: its holder (pid %s) is gone; taking it", key, row["pid"])
            epoch = await conn.fetchval(_TAKE, key, me, host, lease_s, row["epoch"])
        if epoch is None:
            prefix, _, name = key.rpartition("/")
            holder = _describe(await conn.fetchrow(_HOLDER, key))
            raise NameHeld(f"instance name {name!r} (prefix {prefix!r}) is held by {holder}")
    return int(epoch)


async def fence_out(conn: Conn, key: str, lease_s: float) -> bool:
    """Take and at once release the lease `key` when nobody holds it (a writer that was removed
    and stopped): its last holder's epoch is gone, so that process can commit nothing more even
    if it was only frozen. False while it is held."""
    try:
        epoch = await take(conn, key, lease_s)
    except NameHeld:
        return False
    await conn.execute(_RELEASE, key, epoch)
    return True


_FENCE_EXPIRED = (
    "UPDATE instance_leases SET epoch = epoch + 1 WHERE lease_key = $1 AND expires_at <= now()"
    " RETURNING epoch"
)


async def fence_expired(conn: Conn, key: str) -> bool:
    """When the lease `key` has expired (its holder crashed, froze or was cut off), raise its epoch
    and leave it expired: the statement waits for that holder's writes in flight, and it can
    commit nothing more (a frozen holder that wakes finds its lease lost and stops), while the name
    stays free for a restart to take at once. False while the lease is held (a live holder, or a
    restart that took the name, and with it fenced the earlier process)."""
    return await conn.fetchval(_FENCE_EXPIRED, key) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _describe(row: asyncpg.Record | None) -> str:
    if row is None:
        return "another process"
    return (
        f"pid {row['pid']} on {row['host']} since {row['since']:%Y-%m-%d %H:%M:%S}"
        f" (lease ends in {float(row['left_s']):.0f}s unless renewed)"
    )
