"""A worker's first steps, before it has any other part: PostgreSQL (its pool, and the session of
`database_direct_url` where one is configured), Redis, the schema's migrations. Each server is
retried for `startup_retry_s` (`workers.process.startup_retry`), then fails with one clear line
(`workers.process.startup_errors`).
"""

from __future__ import annotations

import time

import asyncpg
import redis.exceptions
from prometheus_client import CollectorRegistry

from workers.config import WorkerConfig
from workers.process.startup_retry import connect_with_retry, ping_direct_postgres, ping_redis
from workers.storage import connect, create_pool
from workers.storage.migrate import apply_migrations
from workers.storage.named_pool import NamedPool, TransactionTimer

#: What "not reachable yet" looks like at start-up (retried for `startup_retry_s`).
POSTGRES_DOWN = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)
REDIS_DOWN = (OSError, TimeoutError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
#: The migrations' transaction name (a name that says what ran, in the slow-transaction metrics).
MIGRATIONS = "workers.storage.migrate.apply_migrations"


async def connect_database(
    config: WorkerConfig, registry: CollectorRegistry
) -> tuple[NamedPool, TransactionTimer]:
    """The worker's pool and the timer of its named transactions; the session of
    `database_direct_url` pinged too, where one is configured."""
    pool = await connect_with_retry(
        "PostgreSQL", config.database_url,
        lambda: create_pool(
            config.database_url, config.db_pool_size,
            transaction_pooler=config.database_pooler == "transaction",
        ),
        config.startup_retry_s, POSTGRES_DOWN,
    )  # fmt: skip
    timer = pool.timer = TransactionTimer(registry, config.db_slow_transaction_s)
    if config.database_direct_url is not None:
        pinging = time.perf_counter()
        await connect_with_retry(
            "PostgreSQL (database_direct_url)", config.database_direct_url,
            lambda: ping_direct_postgres(config.session_database_url), config.startup_retry_s, POSTGRES_DOWN,
        )  # fmt: skip
        timer.observe_held(
            "workers.process.startup_retry.ping_direct_postgres", time.perf_counter() - pinging
        )
    return pool, timer


async def wait_for_redis(config: WorkerConfig) -> None:
    await connect_with_retry(
        "Redis", config.redis_url, lambda: ping_redis(config.redis_url), config.startup_retry_s, REDIS_DOWN
    )


async def migrate(config: WorkerConfig, pool: NamedPool, timer: TransactionTimer) -> None:
    """Apply the schema's migrations (under their advisory lock, which needs one session: through
    `database_direct_url` when the pool's URL is a transaction pooler)."""
    if config.database_direct_url is None:
        async with pool.acquire(name=MIGRATIONS) as conn:
            await apply_migrations(conn)
        return
    migrating = time.perf_counter()
    async with connect(config.database_direct_url) as direct:
        await apply_migrations(direct)
    timer.observe_held(MIGRATIONS, time.perf_counter() - migrating)
