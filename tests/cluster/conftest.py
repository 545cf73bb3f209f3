"""Real worker subprocesses on the test's database and channel prefix."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RedisTarget
from workers.harness.cluster import LocalCluster

MakeCluster = Callable[..., Awaitable[LocalCluster]]


@pytest.fixture
async def make_cluster(
    database_url: str, redis_target: RedisTarget, channel_prefix: str, tmp_path: Path
) -> AsyncIterator[MakeCluster]:
    """`await make_cluster(**options)`: a `LocalCluster` on `redis_target` (`redis=` another
    target), started; every worker must exit 0 when stopped at teardown."""
    clusters: list[LocalCluster] = []

    async def make(redis: RedisTarget | None = None, **options: Any) -> LocalCluster:
        target = redis or redis_target
        options.setdefault("announce_interval_s", 0.2)
        cluster = LocalCluster(
            database_url,
            target.url,
            tmp_path / f"cluster{len(clusters)}",
            channel_prefix=channel_prefix,
            redis_cluster=target.cluster,
            **options,
        )
        clusters.append(cluster)
        await cluster.start()
        return cluster

    yield make
    for cluster in clusters:
        codes = await cluster.stop()
        assert all(code == 0 for code in codes.values()), (codes, {n: cluster.log_tail(n) for n in codes})
