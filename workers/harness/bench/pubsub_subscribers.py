"""The subscriber side of `fanout bench pubsub`: processes that read the bench stream, raw or ours.

Each subscriber is its own process (spawned, so no inherited event loop), started once and reused
by every run: a run sends each process a `Job`, the process answers "ready" once subscribed (for
ours, once connected to the writer) and then the arrival time of every row. The raw job is the
ceiling (redis-py's raw-reply read loop), the other a `ReplicationClient`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import redis.asyncio as aioredis

from pubsub.client import ReplicationClient, ReplicationSettings
from pubsub.redis_transport import SUBSCRIBER_READ_BYTES
from pubsub.streams import Stream
from workers.harness.bench._processes import ProcessPool
from workers.harness.memory import MemoryGenerator
from workers.process import event_loop
from workers.process.gc_tuning import tune_gc

STREAM = "bench"
WRITER = "writer"
JOB_TIMEOUT_S = 60.0


class BenchRow(NamedTuple):
    n: int
    body: str


async def no_rows(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, Any]]:
    return []


def settings(name: str, url: str, prefix: str) -> ReplicationSettings:
    return ReplicationSettings(name, url, channel_prefix=prefix, announce_interval_s=1.0, queue_size=200_000)


# -- subscriber processes ---------------------------------------------------------------------------

#: (kind "raw" | "ours", redis url, channel (raw) or channel prefix (ours), subscriber index, rows)
Job = tuple[str, str, str, int, int]
#: {"received": int, "arrivals": [perf_counter() per row n-1, NaN when not received]}
JobResult = dict[str, Any]


def _subscriber_main(conn: Connection) -> None:
    """Body of one subscriber process: run the jobs the parent sends until it sends None."""
    tune_gc()  # as in a worker process (raw and ours run in this same process)
    while True:
        job: Job | None = conn.recv()
        if job is None:
            return
        kind, url, name, index, total = job
        runner = _raw_subscriber if kind == "raw" else _our_subscriber
        conn.send(event_loop.run(runner(conn, url, name, index, total)))


async def _raw_subscriber(conn: Connection, url: str, channel: str, index: int, total: int) -> JobResult:
    """The ceiling: redis-py's raw-reply read loop, no parsing beyond the row number, with the
    transport's socket read size (which saves hiredis most of its buffer copying)."""
    arrivals = [math.nan] * total
    received = 0
    clock = time.perf_counter
    client = aioredis.Redis.from_url(url, protocol=2, socket_read_size=SUBSCRIBER_READ_BYTES)
    p = client.pubsub()
    await p.subscribe(channel)
    await p.parse_response(block=True)  # the subscribe confirmation
    conn.send("ready")

    async def read() -> None:
        nonlocal received
        while received < total:
            reply = await p.parse_response(block=True)
            if reply[0] == b"message":
                arrivals[int(reply[2].split(b" ", 1)[0]) - 1] = clock()
                received += 1

    try:
        await asyncio.wait_for(read(), JOB_TIMEOUT_S)
    except TimeoutError:
        pass
    await p.aclose()  # type: ignore[no-untyped-call]
    await client.aclose()
    return {"received": received, "arrivals": arrivals}


async def _our_subscriber(conn: Connection, url: str, prefix: str, index: int, total: int) -> JobResult:
    """A `ReplicationClient` reading the bench stream; `apply` notes when each row arrived."""
    arrivals = [math.nan] * total
    applied = 0
    done = asyncio.Event()
    clock = time.perf_counter

    async def apply(stream: Stream[Any], instance: str, token: int, rows: Sequence[tuple[int, Any]]) -> None:
        nonlocal applied
        now = clock()
        for _, row in rows:
            arrivals[row.n - 1] = now
        applied += len(rows)
        if applied >= total:
            done.set()

    stream = Stream(STREAM, BenchRow, no_rows, MemoryGenerator(), [WRITER])
    client = ReplicationClient(settings(f"reader{index}", url, prefix), [stream], apply=apply)
    await client.start()
    deadline = time.monotonic() + 30
    while not client.handler.is_connected(STREAM, WRITER):
        if time.monotonic() > deadline:
            raise RuntimeError("subscriber did not connect to the writer within 30 s")
        await asyncio.sleep(0.005)
    conn.send("ready")
    try:
        await asyncio.wait_for(done.wait(), JOB_TIMEOUT_S)
    except TimeoutError:
        pass
    dropped = {reason: count for (reason,), count in client.metrics.dropped.items()}
    try:
        await asyncio.wait_for(client.stop(), 10)
    except TimeoutError:
        dropped["bench_stop_timed_out"] = 1
    return {"received": applied, "arrivals": arrivals, "dropped": dropped}


class SubscriberPool(ProcessPool):
    """Subscriber processes, started once and reused by every run."""

    def __init__(self, count: int) -> None:
        super().__init__(_subscriber_main, count)

    async def start_jobs(self, jobs: Sequence[Job]) -> None:
        """Send one job per process and wait until each is subscribed (and, for ours, connected)."""
        for conn, job in zip(self.conns, jobs, strict=False):
            conn.send(job)
        for conn in self.conns[: len(jobs)]:
            ready = await self.recv(conn, 90)
            if ready != "ready":
                raise RuntimeError(f"subscriber process failed to start: {ready!r}")

    async def results(self, count: int) -> list[JobResult]:
        return [await self.recv(conn, JOB_TIMEOUT_S + 30) for conn in self.conns[:count]]
