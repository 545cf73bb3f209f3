from __future__ import annotations

import asyncio
import sys
import uuid

import asyncpg

from tests.conftest import Servers
from workers.storage.migrate import available_migrations


async def test_two_processes_migrating_at_once_end_with_one_schema(servers: Servers) -> None:
    name = f"m_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(servers.admin_url)
    await admin.execute(f"CREATE DATABASE {name}")
    try:
        url = servers.database_url(name)
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-m", "workers.cli", "migrate", "--database-url", url,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
            for _ in range(2)
        ]  # fmt: skip
        results = [await p.communicate() for p in procs]
        assert [p.returncode for p in procs] == [0, 0], results
        outputs = sorted(out.decode() for out, _ in results)
        # Exactly one of them applied the migrations; the other found them applied.
        assert outputs[0].startswith("applied: [") and "up to date" in outputs[1], outputs
        conn = await asyncpg.connect(url)
        versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_version ORDER BY 1")]
        assert versions == [m.version for m in available_migrations()]
        assert await conn.fetchval("SELECT count(*) FROM pg_class WHERE relname = 'stream_positions'") == 1
        await conn.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


async def test_migrating_again_is_a_no_op(database_url: str) -> None:
    from workers.storage.migrate import migrate_url

    assert await migrate_url(database_url) == []
