"""PostgreSQL's connection budget: what a cluster of workers may open against `max_connections`.

Each worker opens at most `db_pool_size` pool connections plus one for its instance-name lease
(ID generators and every other part borrow from the pool). The budget that must hold:

    sum over workers (db_pool_size + 1) + audit JDBC partitions + headroom <= max_connections

The audit (Spark) opens one connection per JDBC partition while it reads. The headroom covers
`superuser_reserved_connections` (3 by default, not usable by an ordinary role) and the operator's
own sessions (psql, pg_dump, `fanout migrate`): `DEFAULT_HEADROOM` is 5.

Behind PgBouncer in transaction mode (`database_pooler: transaction`) a worker's pool connects to
PgBouncer, not to PostgreSQL: those pools count against PgBouncer's `max_client_conn`, and
PostgreSQL sees only PgBouncer's server pool (`default_pool_size` + `reserve_pool_size` per
database and user) and each worker's lease connection on `database_direct_url`:

    sum over direct workers (db_pool_size + 1) + pooled workers x 1 + PgBouncer's server pool
      + audit JDBC partitions + headroom <= max_connections
    sum over pooled workers db_pool_size <= PgBouncer's max_client_conn

`fanout check-config DIR` prints the sums for a directory of worker configurations (`Budget`);
at start-up each worker whose pool reaches PostgreSQL itself compares what its pool may still
open with what the server has free (`check_server`) and logs one warning line when it would not
fit: PostgreSQL would refuse the connection later, under load, as "sorry, too many clients
already". A pooled worker does not: PgBouncer queues its clients for a server connection instead.
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
#: PgBouncer's defaults: `default_pool_size` (server connections per database and user) and
#: `max_client_conn`.
PGBOUNCER_DEFAULT_POOL = 20
PGBOUNCER_DEFAULT_MAX_CLIENTS = 100


@dataclass(frozen=True)
class WorkerShare:
    """One configuration's share: `replicas` processes run it; `pooled` when its pool goes through
    PgBouncer (then only its lease reaches PostgreSQL)."""

    name: str
    pool_size: int
    replicas: int = 1
    pooled: bool = False

    @property
    def connections(self) -> int:
        """Connections to PostgreSQL itself."""
        direct = LEASE_CONNECTIONS if self.pooled else self.pool_size + LEASE_CONNECTIONS
        return direct * self.replicas

    @property
    def pooler_clients(self) -> int:
        """Connections to PgBouncer."""
        return self.pool_size * self.replicas if self.pooled else 0


@dataclass
class Budget:
    """The cluster's sums; `fits(max_connections)` checks PostgreSQL's, `pooler_fits(max_client_conn)`
    PgBouncer's. `pooler_pool` is PgBouncer's server pool (`default_pool_size` + `reserve_pool_size`),
    counted once some worker is pooled."""

    workers: list[WorkerShare] = field(default_factory=list)
    audit_partitions: int = 0
    headroom: int = DEFAULT_HEADROOM
    pooler_pool: int = PGBOUNCER_DEFAULT_POOL

    @property
    def pooled(self) -> bool:
        return any(w.pooled for w in self.workers)

    @property
    def total(self) -> int:
        server_pool = self.pooler_pool if self.pooled else 0
        return sum(w.connections for w in self.workers) + server_pool + self.audit_partitions + self.headroom

    @property
    def pooler_clients(self) -> int:
        return sum(w.pooler_clients for w in self.workers)

    def fits(self, max_connections: int) -> bool:
        return self.total <= max_connections

    def pooler_fits(self, max_client_conn: int) -> bool:
        return self.pooler_clients <= max_client_conn

    def lines(self) -> list[str]:
        """The budget as a person reads it: one line per configuration, then the sums."""
        out = [
            f"{w.name}: {w.replicas} x lease {LEASE_CONNECTIONS} = {w.connections}"
            f" (its pools, {w.replicas} x db_pool_size {w.pool_size} = {w.pooler_clients}, go to PgBouncer)"
            if w.pooled
            else f"{w.name}: {w.replicas} x (db_pool_size {w.pool_size} + lease {LEASE_CONNECTIONS})"
            f" = {w.connections}"
            for w in self.workers
        ]
        if self.pooled:
            out.append(f"PgBouncer server pool (default_pool_size + reserve_pool_size): {self.pooler_pool}")
        out.append(f"audit JDBC partitions: {self.audit_partitions}")
        out.append(f"headroom (reserved and operator sessions): {self.headroom}")
        out.append(f"total: {self.total} (needs max_connections >= {self.total})")
        if self.pooled:
            out.append(
                f"PgBouncer clients: {self.pooler_clients} (needs max_client_conn >= {self.pooler_clients})"
            )
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
