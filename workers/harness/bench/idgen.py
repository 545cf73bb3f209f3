"""`fanout bench idgen`: MultiWriterIdGenerator throughput beside a plain asyncpg ceiling, and start-up time.

Throughput: for each workload (`get_next()` one ID at a time, `get_next_mult(100)`) and each writer
process count (1, 2, 4), one set of spawned processes runs both sides in short alternating slices:
generator, plain loop, plain loop, generator, ... (pairs in ABBA order, so a drift in the machine's load
falls on both sides alike). Every process starts each slice at the same wall-clock moment and counts
the IDs it completed; a slice's rate is the sum of the processes' rates. This machine is shared and
noisy, so the verdict is the median over pairs of (generator slice / the plain slice beside it), with
the median and best of each side, the ratio of medians and the spread of the paired ratios. Also
reported: the writer processes' CPU time (user + system, so the socket calls too) per call on each
side, median over slices. Defaults: 20 pairs of 0.25 s slices per configuration, about 100 s in all
with the start-up part; the paired ratios of single slices still range widely here, their median much
less so (compare runs before trusting a difference of a few percent).

Like for like: the plain loop ("the ceiling") lives in the same processes as the generator, with the
same instance names, the same sequence and the same `stream_positions` table (its own stream name, so
the two sides never touch each other's rows). It sends the same statements in the same order on one
connection held across calls: `SELECT nextval(seq)` (for n IDs: `SELECT nextval(seq) FROM
generate_series(1, $1)`), then the forward-only upsert of this writer's position, autocommit, awaited
before the next allocation. The generator also keeps its connection across calls (its lane of pool
connections; one is used here because calls are sequential), so neither side pays a pool acquire per
call. Differences that are the generator's own cost, and stay in the measurement: the pool's
connection proxy, the positions bookkeeping, and re-taking a connection from the pool when the lane
gave it back during the plain slice (idle for longer than `IDLE_RELEASE_S`: one pool acquire per slice).

Start-up: `create()` of a writer on a stream table with 10 rows vs 1,000,000 rows, alternating,
median of each. Progress on stderr, then one JSON document on stdout and a readable table on stderr.

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
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any

import asyncpg

from idgen import MultiWriterIdGenerator
from workers.harness.bench._common import Figure, drop_database, progress, scratch_database, spread
from workers.process import event_loop

SEQ = "events_stream_seq"
UPSERT = (
    "INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES ($1, $2, $3)"
    " ON CONFLICT (stream_name, instance_name) DO UPDATE SET stream_id = EXCLUDED.stream_id"
    " WHERE stream_positions.stream_id < EXCLUDED.stream_id"
)
TARGET_RATIO = 0.8
STARTUP_TARGET_RATIO = 1.2
GAP_S = 0.05  # between slices: every process finishes its last call before the next slice starts
GEN, PLAIN = "generator", "plain"

Step = Callable[[], Awaitable[None]]


def _schedule(repeats: int) -> list[str]:
    """Slice kinds in ABBA order: pair i is (generator, plain) for even i, (plain, generator) for odd i."""
    kinds: list[str] = []
    for i in range(repeats):
        kinds += [GEN, PLAIN] if i % 2 == 0 else [PLAIN, GEN]
    return kinds


async def _writer(
    url: str,
    batch: int,
    streams: dict[str, str],
    instance: str,
    writers: list[str],
    kinds: list[str],
    start_at: float,
    slice_s: float,
) -> tuple[list[float], list[float]]:
    """This process's rate (IDs/s) and CPU seconds per call in each slice; slice k runs from
    `start_at + k * (slice_s + GAP_S)`."""
    conn = await asyncpg.connect(url)
    pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
    gen = await MultiWriterIdGenerator.create(
        pool, stream_name=streams[GEN], instance_name=instance, writers=writers, sequence_name=SEQ,
        tables=[("events", "instance_name", "stream_ordering")],
    )  # fmt: skip
    single, mult = f"SELECT nextval('{SEQ}')", f"SELECT nextval('{SEQ}') FROM generate_series(1, $1)"
    plain_stream = streams[PLAIN]

    async def plain_step() -> None:
        if batch == 1:
            top = await conn.fetchval(single)
        else:
            top = max(r[0] for r in await conn.fetch(mult, batch))
        await conn.execute(UPSERT, plain_stream, instance, top)

    async def gen_step() -> None:
        if batch == 1:
            async with gen.get_next():
                pass
        else:
            async with gen.get_next_mult(batch):
                pass

    steps: dict[str, Step] = {GEN: gen_step, PLAIN: plain_step}
    rates: list[float] = []
    cpu_per_call: list[float] = []
    try:
        for _ in range(20):
            await gen_step()
            await plain_step()
        for k, kind in enumerate(kinds):
            step = steps[kind]
            begin = start_at + k * (slice_s + GAP_S)
            await asyncio.sleep(max(0.0, begin - time.time()))
            t0, cpu0 = time.time(), time.process_time()
            end = begin + slice_s
            count = 0
            t = t0
            while t < end:
                await step()
                count += batch
                t = time.time()
            rates.append(count / (t - t0))
            cpu_per_call.append((time.process_time() - cpu0) / (count // batch))
    finally:
        await gen.close()
        await pool.close()
        await conn.close()
    return rates, cpu_per_call


def _writer_process(
    args: tuple[str, int, dict[str, str], str, list[str], list[str], float, float],
) -> tuple[list[float], list[float]]:
    return event_loop.run(_writer(*args))


def _throughput(ctx: Any, url: str, label: str, batch: int, procs: int, repeats: int,
                slice_s: float) -> dict[str, Any]:  # fmt: skip
    tag = uuid.uuid4().hex[:6]
    streams = {GEN: f"bench_gen_{batch}_{procs}_{tag}", PLAIN: f"bench_plain_{batch}_{procs}_{tag}"}
    writers = [f"w{i}" for i in range(procs)]
    kinds = _schedule(repeats)
    start_at = time.time() + 2.0 + 0.4 * procs  # time to spawn, connect and warm up
    jobs = [(url, batch, streams, w, writers, kinds, start_at, slice_s) for w in writers]
    with ctx.Pool(procs) as pool:
        per_process: list[tuple[list[float], list[float]]] = pool.map(_writer_process, jobs)
    totals = [sum(rates) for rates in zip(*(p[0] for p in per_process), strict=True)]
    cpu = [statistics.mean(c) for c in zip(*(p[1] for p in per_process), strict=True)]
    gen_cpu = [c for c, kind in zip(cpu, kinds, strict=True) if kind == GEN]
    plain_cpu = [c for c, kind in zip(cpu, kinds, strict=True) if kind == PLAIN]
    gen = [r for r, kind in zip(totals, kinds, strict=True) if kind == GEN]
    plain = [r for r, kind in zip(totals, kinds, strict=True) if kind == PLAIN]
    paired = [g / p for g, p in zip(gen, plain, strict=True)]
    ratio = statistics.median(paired)
    return {
        "workload": label,
        "processes": procs,
        "pairs": repeats,
        "generator_ids_per_s": round(statistics.median(gen)),
        "generator_best_ids_per_s": round(max(gen)),
        "generator_spread": round(spread(gen), 3),
        "plain_ids_per_s": round(statistics.median(plain)),
        "plain_best_ids_per_s": round(max(plain)),
        "plain_spread": round(spread(plain), 3),
        "ratio": round(ratio, 3),
        "ratio_of_medians": round(statistics.median(gen) / statistics.median(plain), 3),
        "ratio_of_best": round(max(gen) / max(plain), 3),
        "paired_ratio_min": round(min(paired), 3),
        "paired_ratio_max": round(max(paired), 3),
        "target_met": ratio >= TARGET_RATIO,
        "generator_client_cpu_us_per_call": round(statistics.median(gen_cpu) * 1e6, 1),
        "plain_client_cpu_us_per_call": round(statistics.median(plain_cpu) * 1e6, 1),
        "generator_slices": [round(r) for r in gen],
        "plain_slices": [round(r) for r in plain],
    }


async def _startup_table(conn: asyncpg.Connection[asyncpg.Record], table: str, rows: int) -> None:
    seq = f"{table}_seq"
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


async def _startup_times(url: str, sizes: dict[str, int], runs: int) -> dict[str, list[float]]:
    """`create()` times per table, the tables taking turns so that load drifts hit all of them alike."""
    conn = await asyncpg.connect(url)
    try:
        for label, rows in sizes.items():
            await _startup_table(conn, f"start_{label}", rows)
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(url, min_size=2, max_size=2)
    times: dict[str, list[float]] = {label: [] for label in sizes}
    try:
        for i in range(runs + 2):
            for label in sizes:
                table = f"start_{label}"
                t0 = time.perf_counter()
                gen = await MultiWriterIdGenerator.create(
                    pool, stream_name=table, instance_name="a", writers=["a", "b"],
                    sequence_name=f"{table}_seq", tables=[(table, "instance_name", "stream_id")],
                )  # fmt: skip
                if i >= 2:  # the first two warm the catalog caches of both connections
                    times[label].append(time.perf_counter() - t0)
                await gen.close()
    finally:
        await pool.close()
    return times


def _row_line(row: dict[str, Any]) -> str:
    return (
        f"{row['workload']:<20}{row['processes']:>5}"
        f"{row['generator_ids_per_s']:>11,}{row['generator_best_ids_per_s']:>10,}"
        f"{row['generator_spread'] * 100:>6.0f}%"
        f"{row['plain_ids_per_s']:>11,}{row['plain_best_ids_per_s']:>10,}{row['plain_spread'] * 100:>6.0f}%"
        f"{row['ratio']:>8.2f}  {row['paired_ratio_min']:.2f}-{row['paired_ratio_max']:.2f}"
        f"{row['ratio_of_medians']:>8.2f}  {'yes' if row['target_met'] else 'NO ':<4}"
        f"{row['generator_client_cpu_us_per_call']:>7.0f}/{row['plain_client_cpu_us_per_call']:.0f}"
    )


def _table(result: dict[str, Any]) -> str:
    lines = [
        f"IDs/s per slice: median, best, spread (max-min)/median; {result['pairs']} pairs of "
        f"{result['slice_s']} s slices; ratio = median of paired generator/plain (target >= {TARGET_RATIO})",
        f"{'':<25}{'---------- generator':>27}{'---------- plain loop':>27}",
        f"{'workload':<20}{'procs':>5}{'median':>11}{'best':>10}{'spread':>7}{'median':>11}{'best':>10}"
        f"{'spread':>7}{'ratio':>8}  {'pairs':<9}{'med/med':>8}  met  cpu us/call gen/plain",
    ]
    lines += [_row_line(row) for row in result["throughput"]]
    s = result["startup"]
    lines.append(
        f"start-up: {s['rows_small']:,} rows {s['small_s'] * 1000:.1f} ms, {s['rows_large']:,} rows "
        f"{s['large_s'] * 1000:.1f} ms (medians of {s['runs']}), ratio {s['ratio']:.2f} "
        f"(target <= {STARTUP_TARGET_RATIO}: {'met' if s['target_met'] else 'NOT met'})"
    )
    return "\n".join(lines)


def figures(result: dict[str, Any]) -> list[Figure]:
    """The generator beside the plain SQL loop (ratio: median of the paired slices), and start-up."""
    found = [
        Figure(
            "idgen",
            f"{row['workload']}, {row['processes']} process(es)",
            row["generator_ids_per_s"],
            "IDs/s",
            row["plain_ids_per_s"],
            f"ratio >= {TARGET_RATIO}",
            row["target_met"],
            row["ratio"],
        )
        for row in result["throughput"]
    ]
    s = result["startup"]
    found.append(
        Figure(
            "idgen",
            f"start-up, {s['rows_large']:,} rows (ceiling: {s['rows_small']} rows)",
            s["large_s"] * 1000,
            "ms",
            s["small_s"] * 1000,
            f"ratio <= {STARTUP_TARGET_RATIO}",
            s["target_met"],
        )
    )
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fanout bench idgen", description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="admin URL of a PostgreSQL (default: start embedded servers)")
    parser.add_argument(
        "--repeats", type=int, default=20, help="generator/plain slice pairs per configuration (default 20)"
    )
    parser.add_argument("--slice", type=float, default=0.25, help="seconds per slice (default 0.25)")
    parser.add_argument("--processes", default="1,2,4", help="writer process counts (default 1,2,4)")
    parser.add_argument(
        "--startup-rows", type=int, default=1_000_000, help="rows of the large start-up table"
    )
    parser.add_argument("--startup-runs", type=int, default=9, help="start-up measurements per size (median)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.slice <= 0:
        parser.error("--repeats must be >= 1 and --slice > 0")
    counts = [int(x) for x in args.processes.split(",") if x]
    ctx = mp.get_context("spawn")
    started = time.monotonic()

    with ExitStack() as stack:
        admin_url = args.database_url
        if admin_url is None:
            from workers.embedded.services import EmbeddedServices

            progress("starting embedded servers ...")
            admin_url = stack.enter_context(EmbeddedServices()).database_url
        url = event_loop.run(scratch_database(admin_url, "idgen"))
        try:
            throughput = []
            for label, batch in (("get_next", 1), ("get_next_mult(100)", 100)):
                for procs in counts:
                    progress(
                        f"{label} x {procs} process(es): {args.repeats} pairs of {args.slice} s slices ..."
                    )
                    row = _throughput(ctx, url, label, batch, procs, args.repeats, args.slice)
                    progress(
                        f"  generator {row['generator_ids_per_s']:,} IDs/s, plain {row['plain_ids_per_s']:,}"
                        f" IDs/s, ratio {row['ratio']:.2f} ({row['paired_ratio_min']:.2f}-"
                        f"{row['paired_ratio_max']:.2f})"
                    )
                    throughput.append(row)
            progress("start-up time ...")
            sizes = {"small": 10, "large": args.startup_rows}
            times = event_loop.run(_startup_times(url, sizes, args.startup_runs))
        finally:
            event_loop.run(drop_database(admin_url, url))
    small, large = statistics.median(times["small"]), statistics.median(times["large"])
    result = {
        "benchmark": "idgen",
        "pairs": args.repeats,
        "slice_s": args.slice,
        "throughput": throughput,
        "throughput_target_ratio": TARGET_RATIO,
        "throughput_targets_met": all(row["target_met"] for row in throughput),
        "startup": {
            "rows_small": sizes["small"],
            "rows_large": sizes["large"],
            "runs": args.startup_runs,
            "small_s": round(small, 5),
            "large_s": round(large, 5),
            "small_spread": round(spread(times["small"]), 3),
            "large_spread": round(spread(times["large"]), 3),
            "ratio": round(large / small, 3),
            "target_ratio": STARTUP_TARGET_RATIO,
            "target_met": large / small <= STARTUP_TARGET_RATIO,
        },
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result, indent=2))
    print(_table(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
