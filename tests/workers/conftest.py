"""In-process workers on the test's database and channel prefix, stopped at teardown.

Each worker gets a free loopback port picked before it starts, and every worker's `instance_map`
names the ports of the events writers (picked when first named), so room writes reach their
persister from any worker, as in a real cluster.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from workers.app import Worker
from workers.config import WorkerConfig
from workers.embedded.services import free_port
from workers.harness.cluster import LOOPBACK
from workers.harness.cluster_client import ClusterClient

MakeWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def make_worker(database_url: str, redis_url: str, channel_prefix: str) -> AsyncIterator[MakeWorker]:
    started: list[Worker] = []
    ports: dict[str, int] = {}

    async def make(name: str, writers: list[str], **fields: Any) -> Worker:
        drop_filter = fields.pop("drop_filter", None)  # the publish hook, not a setting
        for known in (name, *writers):
            ports.setdefault(known, free_port())
        fields.setdefault("instance_map", {n: f"http://127.0.0.1:{p}" for n, p in ports.items()})
        fields.setdefault("worker_secret", "test-worker-secret-0123456789")
        fields.setdefault("registration", "open")
        fields.setdefault("rc_exempt_addresses", LOOPBACK)
        config = WorkerConfig(
            instance_name=name,
            database_url=fields.pop("database_url", database_url),
            redis_url=fields.pop("redis_url", redis_url),
            channel_prefix=channel_prefix,
            stream_writers={"events": writers, **fields.pop("stream_writers", {})},
            http_port=fields.pop("http_port", ports[name]),
            position_announce_interval_s=0.2,
            **fields,
        )
        worker = Worker(config, drop_filter=drop_filter)
        started.append(worker)
        await worker.start()
        return worker

    yield make
    for worker in reversed(started):
        await worker.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def client_for(
    session: aiohttp.ClientSession, workers: list[Worker], writers: list[str], **options: Any
) -> ClusterClient:
    urls = {w.name: f"http://127.0.0.1:{w.http_port}" for w in workers}
    return ClusterClient(session, urls, writers, **options)
