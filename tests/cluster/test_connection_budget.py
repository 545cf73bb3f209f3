"""The connection budget on a real PostgreSQL whose max_connections is 40: eight worker processes
whose budget fits all start and serve, `fanout check-config DIR` says it fits, and a worker whose
pool would cross the limit says so in one warning line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from tests.workers.worker_process import FANOUT, start_worker
from workers.embedded.services import start_postgres
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import ClusterClient, timeline_events
from workers.storage.migrate import migrate_url

MAX_CONNECTIONS = 40
POOL = 3  # eight workers x (3 + the lease) + headroom 5 = 37 <= 40


@pytest.fixture
def small_postgres(tmp_path: Path) -> Iterator[str]:
    """A PostgreSQL of this test's own with max_connections=40 (the shared one has 400); its
    admin URL."""
    server = start_postgres(tmp_path / "pg" / "data", settings=[f"max_connections={MAX_CONNECTIONS}"])
    try:
        yield server.url
    finally:
        server.stop()


def _check_config(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    return subprocess.run(
        [FANOUT, "check-config", str(directory), *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def test_eight_workers_fit_forty_connections(
    small_postgres: str, redis_url: str, tmp_path: Path
) -> None:
    database_url = small_postgres.rpartition("/")[0] + "/fanout"
    admin = await asyncpg.connect(small_postgres)
    await admin.execute("CREATE DATABASE fanout")
    await admin.close()
    await migrate_url(database_url)
    cluster = LocalCluster(
        database_url, redis_url, tmp_path / "cluster",
        persisters=2, sync_workers=5, background_workers=1,
        channel_prefix=f"budget-{uuid.uuid4().hex[:8]}", announce_interval_s=0.2,
        extra_config={"db_pool_size": POOL},
    )  # fmt: skip
    try:
        await cluster.start()
        assert len(cluster.workers) == 8
        checked = await asyncio.to_thread(
            _check_config, cluster.workdir, "--max-connections", str(MAX_CONNECTIONS)
        )
        assert checked.returncode == 0, checked.stderr
        assert "total: 37" in checked.stdout and "fits max_connections=40" in checked.stdout
        async with aiohttp.ClientSession() as session:
            alice = ClusterClient(session, cluster.urls)
            await alice.register("alice", via="sync1")
            room = await alice.create_room("public", via="sync1")
            since = {name: (await alice.sync(name))["next_batch"] for name in cluster.workers}
            for i, name in enumerate(cluster.workers):  # every worker takes a write...
                await alice.send(room, "m.room.message", {"n": i}, via=name)
            for name in cluster.workers:  # ...and every worker serves every one of them
                seen: list[int] = []
                for _ in range(20):
                    result = await alice.sync(name, since[name], 2000)
                    since[name] = result["next_batch"]
                    seen += [e["content"]["n"] for e in timeline_events(result) if "n" in e["content"]]
                    if len(seen) >= len(cluster.workers):
                        break
                assert seen == list(range(len(cluster.workers))), name
        for name in cluster.workers:
            assert "connection budget" not in cluster.log_path(name).read_text(), name

        # A ninth worker whose pool would not fit: one warning line, and it still starts.
        config = {
            "instance_name": "greedy", "database_url": database_url, "redis_url": redis_url,
            "channel_prefix": cluster.channel_prefix, "stream_writers": {"events": cluster.event_writers},
            "http_port": 0, "event_loop": "asyncio", "db_pool_size": 30,
        }  # fmt: skip
        greedy = await asyncio.to_thread(start_worker, config, tmp_path / "greedy.yaml")
        greedy.terminate()
        _, stderr = await asyncio.to_thread(greedy.communicate, timeout=30)
        warnings = [line for line in stderr.splitlines() if "connection budget" in line]
        assert len(warnings) == 1 and "WARNING" in warnings[0], stderr
        assert "max_connections=40" in warnings[0] and "db_pool_size 30" in warnings[0]
        over = await asyncio.to_thread(_check_config, cluster.workdir, "--max-connections", "36")
        assert over.returncode == 2 and over.stderr.count("\n") == 1, over.stderr
    finally:
        codes = await cluster.stop()
        assert all(code == 0 for code in codes.values()), codes
