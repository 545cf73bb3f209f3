"""Kill real writer processes with SIGKILL at random moments: no ID is ever handed out twice."""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from pathlib import Path
from typing import Any

import asyncpg

from idgen import MultiWriterIdGenerator

ROOT = Path(__file__).resolve().parents[2]


async def start_writer(url: str, instance: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.idgen.killable_writer", url, instance,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 20)
    if line.strip() != b"ready":
        assert proc.stderr is not None
        raise AssertionError(f"writer {instance} failed to start: {(await proc.stderr.read()).decode()}")
    return proc


async def test_sigkill_never_reuses_an_id(database_url: str, db_pool: asyncpg.Pool) -> None:
    await db_pool.execute(
        "CREATE SEQUENCE kill_seq;"
        "CREATE TABLE kill_rows (stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL);"  # no unique index
        "CREATE INDEX ON kill_rows (stream_id);"
    )
    rng = random.Random(3)
    procs = {w: await start_writer(database_url, w) for w in ("w1", "w2")}
    try:
        for _ in range(6):
            await asyncio.sleep(rng.uniform(0.05, 0.3))
            victim = rng.choice(["w1", "w2"])
            procs[victim].send_signal(signal.SIGKILL)
            await procs[victim].wait()
            procs[victim] = await start_writer(database_url, victim)
        await asyncio.sleep(0.2)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    total, distinct, top = await db_pool.fetchrow(
        "SELECT count(*), count(DISTINCT stream_id), max(stream_id) FROM kill_rows"
    )
    assert total > 50
    assert total == distinct
    seq_max = await db_pool.fetchval("SELECT last_value FROM kill_seq")
    assert seq_max >= top
    assert (
        await db_pool.fetchval("SELECT max(stream_id) FROM stream_positions WHERE stream_name = 'kill'")
        <= seq_max
    )
    # A writer killed between its commit and its upsert leaves a stale row: readers are held back (never
    # ahead) until it restarts; restarted writers start at the sequence's max, so the stream catches up.
    opts: dict[str, Any] = {
        "stream_name": "kill",
        "tables": [("kill_rows", "instance_name", "stream_id")],
        "sequence_name": "kill_seq",
        "writers": ["w1", "w2"],
    }
    reader = await MultiWriterIdGenerator.create(db_pool, instance_name="r", **opts)
    assert reader.get_current_token() <= top
    await reader.close()
    for w in ("w1", "w2"):
        await (await MultiWriterIdGenerator.create(db_pool, instance_name=w, **opts)).close()
    reader = await MultiWriterIdGenerator.create(db_pool, instance_name="r", **opts)
    assert reader.get_current_token() >= top
    await reader.close()
