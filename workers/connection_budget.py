"""PostgreSQL's connection budget: what a cluster of workers may open against `max_connections`.

Each worker opens at most `db_pool_size` pool connections plus one for its instance-name lease
(ID generators and every other part borrow from the pool). The budget that must hold:

    sum over workers (db_pool_size + 1) + audit JDBC partitions + headroom <= max_connections

The audit (Spark) opens one connection per JDBC partition while it reads. The headroom covers
`superuser_reserved_connections` (3 by default, not usable by an ordinary role) and the operator's
own sessions (psql, pg_dump, `fanout migrate`): `DEFAULT_HEADROOM` is 5.

`fanout check-config DIR` prints the sum for a directory of worker configurations (`Budget`);
at start-up each worker compares what its pool may still open with what the server has free
(`check_server`) and logs one warning line when it would not fit: PostgreSQL would refuse the
connection later, under load, as "sorry, too many clients already".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from workers.storage import Conn

log = logging.getLogger(__name__)
#: The instance-name lease's own session, beside the pool.
LEASE_CONNECTIONS = 1
DEFAULT_HEADROOM = 5


@dataclass(frozen=True)
class WorkerShare:
    """One configuration's share: `replicas` processes run it."""

    name: str
    pool_size: int
    replicas: int = 1

    @property
    def connections(self) -> int:
        return (self.pool_size + LEASE_CONNECTIONS) * self.replicas


@dataclass
class Budget:
    """The cluster's sum; `fits(max_connections)` checks it against a server's limit."""

    workers: list[WorkerShare] = field(default_factory=list)
    audit_partitions: int = 0
    headroom: int = DEFAULT_HEADROOM

    @property
    def total(self) -> int:
        return sum(w.connections for w in self.workers) + self.audit_partitions + self.headroom

    def fits(self, max_connections: int) -> bool:
        return self.total <= max_connections

    def lines(self) -> list[str]:
        """The budget as a person reads it: one line per configuration, then the sum."""
        out = [
            f"{w.name}: {w.replicas} x (db_pool_size {w.pool_size} + lease {LEASE_CONNECTIONS})"
            f" = {w.connections}"
            for w in self.workers
        ]
        out.append(f"audit JDBC partitions: {self.audit_partitions}")
        out.append(f"headroom (reserved and operator sessions): {self.headroom}")
        out.append(f"total: {self.total} (needs max_connections >= {self.total})")
        return out


@dataclass(frozen=True)
class ServerConnections:
    """What the server allows and uses now, as this worker's role sees it."""

    max_connections: int
    reserved: int
    in_use: int

    @property
    def free(self) -> int:
        return self.max_connections - self.reserved - self.in_use


async def server_connections(conn: Conn) -> ServerConnections:
    """`max_connections`, the slots an ordinary role may not take (none for a superuser), and the
    client sessions open now (this worker's own included)."""
    row = await conn.fetchrow(
        "SELECT current_setting('max_connections')::int AS max_connections,"
        " CASE WHEN current_setting('is_superuser') = 'on' THEN 0 ELSE"
        "  current_setting('superuser_reserved_connections')::int"
        "  + coalesce(current_setting('reserved_connections', true), '0')::int END AS reserved,"
        " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int AS in_use"
    )
    assert row is not None  # a SELECT without FROM has one row
    return ServerConnections(row["max_connections"], row["reserved"], row["in_use"])


async def check_server(pool: asyncpg.Pool[Any], pool_size: int, where: str) -> ServerConnections | None:
    """Log one warning when the connections the pool may still open exceed what the server has
    free; None when the server could not be asked (the worker starts anyway)."""
    try:
        async with pool.acquire() as conn:
            server = await server_connections(conn)
    except (asyncpg.PostgresError, OSError) as e:
        log.warning("connection budget: could not read the server's limits (%s)", e)
        return None
    may_open = max(0, pool_size - pool.get_size())
    if may_open > server.free:
        log.warning(
            "connection budget: PostgreSQL at %s has %d of max_connections=%d in use (%d reserved),"
            " %d free, and this worker's pool (db_pool_size %d) may open %d more: lower db_pool_size"
            " or raise max_connections (docs/operations.md, Capacity)",
            where, server.in_use, server.max_connections, server.reserved, max(0, server.free),
            pool_size, may_open,
        )  # fmt: skip
    return server
