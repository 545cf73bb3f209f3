"""`fanout bench idgen`: MultiWriterIdGenerator throughput beside a plain asyncpg ceiling, and start-up time.

Throughput: 1, 2 and 4 writer processes (spawned), each sending IDs for `--seconds`, one at a time with
`get_next()` and in batches with `get_next_mult(100)`. The ceiling is a plain asyncpg loop on one
connection per process sending the same SQL (nextval for n IDs, then the `stream_positions` upsert),
measured in the same run, alternating with the generator. Start-up: `create()` of a writer on a stream
table with 10 rows vs 1,000,000 rows (median of several runs). Progress on stderr, then one JSON
document on stdout and a readable table on stderr.

Without `--database-url` the embedded servers are started. With it, the URL is an admin URL: a fresh
database is created there for the run and dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from contextlib import ExitStack
from typing import Any

import asyncpg

from idgen import MultiWriterIdGenerator

SEQ = "events_stream_seq"
UPSERT = (
    "INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES ($1, $2, $3)"
    " ON CONFLICT (stream_name, instance_name) DO UPDATE SET stream_id = EXCLUDED.stream_id"
    " WHERE stream_positions.stream_id < EXCLUDED.stream_id"
)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _writer(url: str, kind: str, batch: int, stream: str, instance: str, writers: list[str],
                  start_at: float, seconds: float) -> int:  # fmt: skip
    """Count IDs handed out between `start_at` and `start_at + seconds` (wall clock, shared by processes)."""
    if kind == "plain":
        conn = await asyncpg.connect(url)
        single, mult = f"SELECT nextval('{SEQ}')", f"SELECT nextval('{SEQ}') FROM generate_series(1, $1)"

        async def step() -> None:
            if batch == 1:
                top = await conn.fetchval(single)
            else:
                top = max(r[0] for r in await conn.fetch(mult, batch))
            await conn.execute(UPSERT, stream, instance, top)

        close: Any = conn.close
    else:
        pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
        gen = await MultiWriterIdGenerator.create(
            pool, stream_name=stream, instance_name=instance, writers=writers, sequence_name=SEQ,
            tables=[("events", "instance_name", "stream_ordering")],
        )  # fmt: skip

        async def step() -> None:
            if batch == 1:
                async with gen.get_next():
                    pass
            else:
                async with gen.get_next_mult(batch):
                    pass

        async def close() -> None:
            await gen.close()
            await pool.close()

    for _ in range(20):
        await step()
    await asyncio.sleep(max(0.0, start_at - time.time()))
    end = start_at + seconds
    count = 0
    while time.time() < end:
        await step()
        count += batch
    await close()
    return count


def _writer_process(args: tuple[str, str, int, str, str, list[str], float, float]) -> int:
    return asyncio.run(_writer(*args))


def _throughput(ctx: Any, url: str, kind: str, batch: int, procs: int, seconds: float) -> float:
    stream = f"bench_{kind}_{batch}_{procs}_{uuid.uuid4().hex[:6]}"
    writers = [f"w{i}" for i in range(procs)]
    start_at = time.time() + 1.5 + 0.3 * procs  # time to spawn and connect
    jobs = [(url, kind, batch, stream, w, writers, start_at, seconds) for w in writers]
    with ctx.Pool(procs) as pool:
        counts = pool.map(_writer_process, jobs)
    return float(sum(counts)) / seconds


async def _startup_time(url: str, label: str, rows: int, runs: int) -> float:
    table, seq = f"start_{label}", f"start_{label}_seq"
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            f"CREATE TABLE {table} (stream_id BIGINT PRIMARY KEY, instance_name TEXT NOT NULL);"
            f"CREATE SEQUENCE {seq};"
            f"INSERT INTO {table} SELECT g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END"
            f" FROM generate_series(1, {rows}) g;"
            f"SELECT setval('{seq}', {rows});"
            f"INSERT INTO stream_positions VALUES ('{table}', 'a', {rows}), ('{table}', 'b', 5);"
        )
        # A production table is vacuumed; measure that steady state, not the first reads after a bulk load.
        await conn.execute(f"VACUUM ANALYZE {table}")
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(url, min_size=2, max_size=2)
    times: list[float] = []
    try:
        for i in range(runs + 2):
            t0 = time.perf_counter()
            gen = await MultiWriterIdGenerator.create(
                pool, stream_name=table, instance_name="a", writers=["a", "b"], sequence_name=seq,
                tables=[(table, "instance_name", "stream_id")],
            )  # fmt: skip
            if i >= 2:  # the first two warm the catalog caches of both connections
                times.append(time.perf_counter() - t0)
            await gen.close()
    finally:
        await pool.close()
    return statistics.median(times)


async def _create_database(admin_url: str) -> tuple[str, str]:
    from workers.storage.migrate import migrate_url

    name = f"bench_idgen_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    url = f"{admin_url.rpartition('/')[0]}/{name}"
    await migrate_url(url)
    return name, url


async def _drop_database(admin_url: str, name: str) -> None:
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


def _table(result: dict[str, Any]) -> str:
    lines = [f"{'workload':<22}{'procs':>6}{'generator IDs/s':>17}{'plain loop IDs/s':>18}{'ratio':>8}"]
    for row in result["throughput"]:
        lines.append(
            f"{row['workload']:<22}{row['processes']:>6}{row['generator_ids_per_s']:>17,.0f}"
            f"{row['plain_ids_per_s']:>18,.0f}{row['ratio']:>8.2f}"
        )
    s = result["startup"]
    lines.append(
        f"start-up: {s['rows_small']:,} rows {s['small_s'] * 1000:.1f} ms, {s['rows_large']:,} rows "
        f"{s['large_s'] * 1000:.1f} ms, ratio {s['ratio']:.2f} (target <= 1.2)"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fanout bench idgen", description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="admin URL of a PostgreSQL (default: start embedded servers)")
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per workload (default 2)")
    parser.add_argument("--processes", default="1,2,4", help="writer process counts (default 1,2,4)")
    parser.add_argument(
        "--startup-rows", type=int, default=1_000_000, help="rows of the large start-up table"
    )
    parser.add_argument("--startup-runs", type=int, default=7, help="start-up measurements per size (median)")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.processes.split(",") if x]
    ctx = mp.get_context("spawn")

    with ExitStack() as stack:
        admin_url = args.database_url
        if admin_url is None:
            from workers.services import EmbeddedServices

            _progress("starting embedded servers ...")
            admin_url = stack.enter_context(EmbeddedServices()).database_url
        name, url = asyncio.run(_create_database(admin_url))
        try:
            throughput = []
            for label, batch in (("get_next", 1), ("get_next_mult(100)", 100)):
                for procs in counts:
                    _progress(f"{label} x {procs} process(es): plain loop ...")
                    plain = _throughput(ctx, url, "plain", batch, procs, args.seconds)
                    _progress(f"{label} x {procs} process(es): generator ...")
                    gen = _throughput(ctx, url, "gen", batch, procs, args.seconds)
                    throughput.append(
                        {
                            "workload": label,
                            "processes": procs,
                            "generator_ids_per_s": round(gen),
                            "plain_ids_per_s": round(plain),
                            "ratio": round(gen / plain, 3),
                        }
                    )
            _progress("start-up time ...")
            small = asyncio.run(_startup_time(url, "small", 10, args.startup_runs))
            large = asyncio.run(_startup_time(url, "large", args.startup_rows, args.startup_runs))
        finally:
            asyncio.run(_drop_database(admin_url, name))
    result = {
        "benchmark": "idgen",
        "seconds_per_workload": args.seconds,
        "throughput": throughput,
        "throughput_target_ratio": 0.8,
        "startup": {
            "rows_small": 10,
            "rows_large": args.startup_rows,
            "small_s": round(small, 5),
            "large_s": round(large, 5),
            "ratio": round(large / small, 3),
            "target_ratio": 1.2,
        },
    }
    print(json.dumps(result, indent=2))
    print(_table(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
