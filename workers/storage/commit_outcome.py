"""Whether a write committed when its connection broke at COMMIT.

A COMMIT whose answer never came back (the link cut, the backend terminated, the reply lost) may
have happened or not, and PostgreSQL may still be working on it: a backend that received COMMIT
completes it even though its client is gone, possibly after the client gave up. A writer that
counted such a write's IDs as finished before knowing would let readers pass a position whose rows
appear later, behind them. So before the IDs finish, `committed` learns the truth on a fresh
connection:

1. end the old backend: `pg_terminate_backend` while it is in `pg_stat_activity`, until it is
   gone (a backend leaves `pg_stat_activity` only after its transaction ended, so from then on
   nothing it holds can still commit);
2. ask whether the write is there: its rows (`row_exists`: free on the normal path, for writes
   whose rows carry their allocated stream IDs for good), or its transaction's state
   (`xid_committed`: `txid_status` of the `txid_current()` read inside the transaction).

While PostgreSQL cannot be reached this retries (backoff up to `RETRY_CAP_S`) until it can: the
write's IDs stay unfinished meanwhile, which holds back only this writer's position. Cancelling
(shutdown) interrupts it; the caller then falls back to telling readers the outcome is unknown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import asyncpg

from idgen.multi_writer import DATABASE_DOWN
from workers.storage import Conn

log = logging.getLogger(__name__)
RETRY_FIRST_S = 0.05
RETRY_CAP_S = 1.0
GONE_POLL_S = 0.01
#: The transaction's id, read inside it (before COMMIT) for `xid_committed`, and its backend's pid
#: (behind a transaction pooler the connection's `get_server_pid()` is the pooler's, not the
#: backend's that runs the transaction).
CURRENT_XID_SQL = "SELECT txid_current() AS xid, pg_backend_pid() AS pid"
#: The pid of the backend running this transaction, read inside it.
BACKEND_PID_SQL = "SELECT pg_backend_pid()"
#: SQLSTATE classes whose error answer ends the connection: the outcome is not known from it
#: (connection exception, operator intervention, system error, internal error).
_FATAL_CLASSES = frozenset({"08", "57", "58", "XX"})

#: Whether the write is in the database, asked on a fresh connection once the old backend is gone.
Probe = Callable[[Conn], Awaitable[bool]]


def outcome_unknown(error: BaseException) -> bool:
    """Whether `error`, raised by a COMMIT (or by a statement that commits on its own), leaves the
    outcome unknown. An error answer from PostgreSQL means it rolled the transaction back, unless
    its class ends the connection; anything else (no answer: a lost link, a closed connection, a
    timeout, a cancellation) leaves it unknown."""
    if isinstance(error, asyncpg.PostgresError):
        return str(getattr(error, "sqlstate", "") or "")[:2] in _FATAL_CLASSES
    return True


def row_exists(table: str, column: str, value: int) -> Probe:
    """The write is there when `table` has a row with `column` = `value` (a stream ID only this
    write used, on a row never deleted or renumbered)."""
    sql = f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {column} = $1)"

    async def probe(conn: Conn) -> bool:
        return bool(await conn.fetchval(sql, value))

    return probe


def xid_committed(xid: int) -> Probe:
    """The write is there when its transaction `xid` (from `CURRENT_XID_SQL`) committed."""

    async def probe(conn: Conn) -> bool:
        status = await conn.fetchval("SELECT txid_status($1)", xid)
        if status == "in progress":  # unreachable once the backend is gone; never guess
            raise asyncpg.InterfaceError(f"transaction {xid} is still in progress")
        return bool(status == "committed")

    return probe


async def committed(pool: asyncpg.Pool, backend_pid: int, probe: Probe, what: str) -> bool:
    """End backend `backend_pid` (the one whose COMMIT's answer was lost), then `probe`: whether
    the write committed. Retries until PostgreSQL answers; logs one line with the outcome."""
    started = time.monotonic()
    delay = RETRY_FIRST_S
    attempts = 0
    while True:
        attempts += 1
        try:
            async with pool.acquire() as conn:
                await _end_backend(conn, backend_pid)
                outcome = await probe(conn)
        except DATABASE_DOWN:
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP_S)
            continue
        log.warning(
            "connection lost at COMMIT of %s: it %s (learned after %.2fs, %d attempt(s), old backend %d)",
            what, "committed" if outcome else "did not commit", time.monotonic() - started, attempts,
            backend_pid,
        )  # fmt: skip
        return outcome


async def _end_backend(conn: Conn, pid: int) -> None:
    """Terminate backend `pid` unless it is gone, and return once it is gone."""
    if conn.get_server_pid() == pid:
        return  # its pid is ours now: it is long gone
    # Behind a pooler our statement may run on that very backend: then its transaction is over.
    sql = (
        "SELECT CASE WHEN pid = pg_backend_pid() THEN NULL ELSE pg_terminate_backend(pid) END"
        " FROM pg_stat_activity WHERE pid = $1"
    )
    while True:  # a poll: PostgreSQL offers nothing to wait on for another backend's exit
        if await conn.fetchval(sql, pid) is None:
            return
        await asyncio.sleep(GONE_POLL_S)
