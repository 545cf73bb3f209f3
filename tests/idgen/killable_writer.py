"""A writer process for the SIGKILL test: `python -m tests.idgen.killable_writer URL INSTANCE`.

Loops forever: allocate an ID, insert a row with it (in a transaction), let the block finish (upsert).
Prints "ready" once the generator has started, so the test knows start-up succeeded.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg

from idgen import MultiWriterIdGenerator


async def run(url: str, instance: str) -> None:
    pool = await asyncpg.create_pool(url, min_size=2, max_size=4)
    assert pool is not None
    gen = await MultiWriterIdGenerator.create(
        pool,
        stream_name="kill",
        instance_name=instance,
        tables=[("kill_rows", "instance_name", "stream_id")],
        sequence_name="kill_seq",
        writers=["w1", "w2"],
    )
    print("ready", flush=True)
    while True:
        async with gen.get_next_mult(3) if instance == "w2" else gen.get_next() as ids:
            rows = ids if isinstance(ids, list) else [ids]
            async with pool.acquire() as conn, conn.transaction():
                await conn.executemany(
                    "INSERT INTO kill_rows (stream_id, instance_name) VALUES ($1, $2)",
                    [(i, instance) for i in rows],
                )


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], sys.argv[2]))
