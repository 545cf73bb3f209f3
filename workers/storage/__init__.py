"""Storage: the schema migrations (`migrations/*.sql`, applied by `migrate.py`) and one module of SQL
per domain. Functions take a connection, never a pool, so the caller decides what runs in one
transaction. Storage imports nothing of `workers` but `model`; never `http`, `handlers` or `harness`.

Its modules:

* `account_data.py`: SQL of the account_data stream: global account data, room account data and room
  tags
* `commit_outcome.py`: Whether a write committed when its connection broke at COMMIT
* `device_lists.py`: SQL of the device_lists stream: which local users' device lists changed, and
  the outbound pokes (one per remote server that shares a room with the user) that a ...
* `devices.py`: Device keys: local devices' uploaded keys, and cached device lists of remote users
* `directory.py`: Room aliases (`#name:server` -> `!room:server`)
* `events.py`: SQL for events, current state, membership and the caches log
* `forgotten_rooms.py`: Rooms a user forgot (`POST /rooms/{roomId}/forget`), and which of them /sync
  leaves out
* `handovers.py`: SQL for `room_handovers` and `stream_handovers`: where a key changed writer, and
  the old writer's last row of it
* `named_pool.py`: Every database transaction named and timed: a pool whose `acquire()` blocks are
  measured
* `one_time_keys.py`: One-time and fallback keys of local devices: stored on upload, handed out on
  claim
* `passwords.py`: Password hashes: argon2id (argon2-cffi), computed in a thread so a login never
  stalls the loop
* `purge.py`: SQL of a room's end on this server: who must leave before a purge, the purge itself,
  whether a room id is blocked (`blocked_rooms`), and whether any local user ...
* `receipts.py`: SQL of the receipts stream: per (room, receipt type, user, thread) the latest event
  read
* `registration_tokens.py`: Registration tokens: who may register when `registration: token`
* `relations.py`: Events by the event they relate to (`m.relates_to.event_id`), through migration
  0019's index
* `room_deletions.py`: The `room_deletions` table: the Delete Room API's version 2 tasks and their
  status
* `rooms.py`: The `rooms` table (each room's version, and whether it lives on another server) and
  the invites that remote servers sent to local users (a stand-in for ...
* `to_device.py`: SQL of the to_device stream: messages waiting for local devices (`device_inbox`)
  and for remote servers (`device_federation_outbox`), and the transaction ids ...
* `user_admin.py`: Whether a user is a server admin (the `admin` column of `users`): who may call
  the admin API and who the rate limits let through
* `users.py`: Accounts, devices, access tokens, uploaded sync filters and registration nonces
* `windows.py`: `Window`: the rows of a multi-writer stream between two tokens, as a SQL condition
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from workers.storage.named_pool import NamedPool

#: A plain connection or one borrowed from a pool.
Conn: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
K = TypeVar("K")
V = TypeVar("V")


async def _keep_session(conn: asyncpg.Connection[Any]) -> None:
    """Pool reset hook: nothing to undo. Our code never changes session state on pooled connections
    (no SET, LISTEN, temporary tables or session locks left behind), so the default reset query
    would be one more round trip on every release for nothing. asyncpg still rolls back a
    transaction left open and clears listeners before calling this."""


class _WithoutTraceback(logging.Filter):
    """asyncpg's pool logs each failed attempt to reconnect its minimum with a traceback: during a
    database outage that is expected, not a bug. Keep it to one line naming the error."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {error}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


_POOL_LOG_FILTER = _WithoutTraceback()


async def create_pool(url: str, max_size: int, *, transaction_pooler: bool = False) -> NamedPool:
    """The worker's connection pool (its transactions named and timed once it has a timer).
    Built as `asyncpg.create_pool` builds it, with its defaults, only of the subclass.

    `transaction_pooler`: `url` is a PgBouncer in transaction mode, which hands each transaction
    (each statement outside one) whichever server connection is free. asyncpg's named prepared
    statements would then be missing or duplicated on the next server, so its statement cache is
    off (100, asyncpg's default, otherwise): asyncpg then uses only unnamed statements."""
    logging.getLogger("asyncpg.pool").addFilter(_POOL_LOG_FILTER)  # once: addFilter ignores repeats
    pool = NamedPool(
        url, min_size=2, max_size=max_size, reset=_keep_session, max_queries=50_000,
        max_inactive_connection_lifetime=300.0, loop=None, connection_class=asyncpg.Connection,
        record_class=asyncpg.Record, statement_cache_size=0 if transaction_pooler else 100,
    )  # fmt: skip
    pool.transaction_pooler = transaction_pooler
    await pool
    return pool


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[asyncpg.Connection[Any]]:
    """One short-lived connection (tools, tests, the demo); workers use their pool."""
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


def pooled(pool: NamedPool, read: Callable[[Conn, K], Awaitable[V]]) -> Callable[[K], Awaitable[V]]:
    """`read(conn, key)` as a loader of `key` alone, on a connection of `pool` (a cache's loader);
    its blocks are named after `read` (`workers.storage.events.user_rooms`)."""
    name = f"{read.__module__}.{read.__qualname__}"

    async def load(key: K) -> V:
        async with pool.acquire(name=name) as conn:
            return await read(conn, key)

    return load
