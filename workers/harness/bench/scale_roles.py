"""The processes of `fanout bench scale`: writers and subscribers, ours and raw redis-py, one a process.

A process is spawned once (no inherited event loop) and runs jobs until sent None. For each job it
sets up (connects, subscribes; a subscriber also waits until it has heard every writer's first
POSITION), answers "ready", waits for "go" (sent to every process at once), runs, and answers its
result: the CPU seconds it spent (`time.process_time`) from "go" until its part was done, and what
it sent or received. Memory generators and update functions that return nothing: this measures
replication over Redis, not PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
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

#: A job: {"role": "writer" | "subscriber" | "raw_writer" | "raw_subscriber", ...} (see each role).
Job = dict[str, Any]
Result = dict[str, Any]
READY_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 120.0
TICK_S = 0.005


class ScaleRow(NamedTuple):
    n: int
    body: str


async def _no_rows(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, Any]]:
    return []


def _settings(job: Job) -> ReplicationSettings:
    where = dict(job["where"])
    where["redis_cluster"] = tuple(where.get("redis_cluster", ()))
    return ReplicationSettings(
        job["name"], **where, channel_prefix=job["prefix"], announce_interval_s=1.0, queue_size=1_000_000
    )


async def _go(conn: Connection) -> None:
    """Wait for the parent's "go" without blocking the event loop."""
    while not conn.poll():  # noqa: ASYNC110 - a pipe, not an event of this loop
        await asyncio.sleep(0.001)
    if conn.recv() != "go":
        raise RuntimeError("expected 'go'")


async def _paced(rate: float, total: int, send: Callable[[int], Awaitable[None]]) -> None:
    """Call `send(k)` every tick with the count due by then, `total` in all at `rate` per second."""
    start = time.perf_counter()
    sent = 0
    while sent < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        if due > sent:
            await send(due - sent)
            sent = due
        await asyncio.sleep(TICK_S)


async def _writer(conn: Connection, job: Job) -> Result:
    """`events` rows at `rate`/s, round-robin over `streams`, published through a `ReplicationClient`."""
    name, streams = job["name"], job["streams"]
    generators = {s: MemoryGenerator() for s in streams}
    client = ReplicationClient(
        _settings(job),
        [Stream(s, ScaleRow, _no_rows, generators[s], job["writers"]) for s in streams],
        read=[],
    )
    await client.start()
    conn.send("ready")
    await _go(conn)
    body = "x" * job["body_bytes"]
    tokens = dict.fromkeys(streams, 0)
    written = 0
    cpu = time.process_time()

    async def send(count: int) -> None:
        nonlocal written
        for _ in range(count):
            stream = streams[written % len(streams)]
            written += 1
            tokens[stream] += 1
            client.stage_rows(stream, [(tokens[stream], ScaleRow(written, body))])
            generators[stream].positions[name] = tokens[stream]
        client.notify()

    await _paced(job["rate"], job["events"], send)
    while any(client.publisher.positions()[s] < tokens[s] for s in streams):  # noqa: ASYNC110
        await asyncio.sleep(TICK_S)
    cpu = time.process_time() - cpu
    errors = client.metrics.publish_errors
    await client.stop()
    return {"cpu_s": cpu, "sent": written, "publish_errors": errors}


async def _subscriber(conn: Connection, job: Job) -> Result:
    """A `ReplicationClient` reading every stream until it applied `expected` rows."""
    applied = 0
    done = asyncio.Event()
    expected = job["expected"]

    async def apply(stream: Stream[Any], instance: str, token: int, rows: Sequence[tuple[int, Any]]) -> None:
        nonlocal applied
        applied += len(rows)
        if applied >= expected:
            done.set()

    streams = [Stream(s, ScaleRow, _no_rows, MemoryGenerator(), job["writers"]) for s in job["streams"]]
    client = ReplicationClient(_settings(job), streams, apply=apply)
    await client.start(wait_subscribed=READY_TIMEOUT_S)
    handler = client.handler
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(handler.is_connected(s.name, w) for s in streams for w in job["writers"]):
        if time.monotonic() > deadline:
            raise RuntimeError("the subscriber did not hear every writer's first POSITION in time")
        await asyncio.sleep(0.005)
    conn.send("ready")
    await _go(conn)
    metrics = client.metrics
    lines = sum(metrics.commands_in.values()) + sum(metrics.dropped.values())
    size, cpu = metrics.bytes_in, time.process_time()
    try:
        await asyncio.wait_for(done.wait(), RUN_TIMEOUT_S)
    except TimeoutError:
        pass
    cpu = time.process_time() - cpu
    result = {
        "cpu_s": cpu,
        "received": applied,
        "lines": sum(metrics.commands_in.values()) + sum(metrics.dropped.values()) - lines,
        "bytes": metrics.bytes_in - size,
        "reconnects": sum(metrics.reconnects.values()),
    }
    await client.stop()
    return result


async def _raw_writer(conn: Connection, job: Job) -> Result:
    """The ceiling's writer: redis-py pipelines PUBLISH of `events` lines of the same size."""
    client = aioredis.Redis.from_url(job["url"], protocol=2)
    await client.ping()
    conn.send("ready")
    await _go(conn)
    line = "RDATA bench w1 1 " + "x" * job["body_bytes"]
    cpu = time.process_time()

    async def send(count: int) -> None:
        pipe = client.pipeline(transaction=False)
        for _ in range(count):
            pipe.publish(job["channel"], line)
        await pipe.execute()

    await _paced(job["rate"], job["events"], send)
    cpu = time.process_time() - cpu
    await client.aclose()
    return {"cpu_s": cpu, "sent": job["events"]}


async def _raw_subscriber(conn: Connection, job: Job) -> Result:
    """The ceiling's subscriber: redis-py's raw-reply read loop, nothing parsed, until `expected`."""
    client = aioredis.Redis.from_url(job["url"], protocol=2, socket_read_size=SUBSCRIBER_READ_BYTES)
    pubsub = client.pubsub()
    await pubsub.subscribe(job["channel"])
    await pubsub.parse_response(block=True)
    conn.send("ready")
    await _go(conn)
    received, expected = 0, job["expected"]
    cpu = time.process_time()

    async def read() -> None:
        nonlocal received
        while received < expected:
            reply = await pubsub.parse_response(block=True)
            if reply[0] == b"message":
                received += 1

    try:
        await asyncio.wait_for(read(), RUN_TIMEOUT_S)
    except TimeoutError:
        pass
    cpu = time.process_time() - cpu
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    await client.aclose()
    return {"cpu_s": cpu, "received": received}


ROLES: dict[str, Callable[[Connection, Job], Coroutine[Any, Any, Result]]] = {
    "writer": _writer,
    "subscriber": _subscriber,
    "raw_writer": _raw_writer,
    "raw_subscriber": _raw_subscriber,
}


def _process_main(conn: Connection) -> None:
    tune_gc()  # as in a worker process
    while (job := conn.recv()) is not None:
        try:
            result = event_loop.run(ROLES[job["role"]](conn, job))
        except Exception as e:  # reported to the parent, which stops the run with it
            result = {"error": f"{job['role']}: {type(e).__name__}: {e}"}
        conn.send(result)


class RolePool(ProcessPool):
    """`size` role processes, reused by every run of the benchmark."""

    def __init__(self, size: int) -> None:
        super().__init__(_process_main, size)

    async def _answer(self, conn: Connection, timeout_s: float) -> Any:
        answer = await self.recv(conn, timeout_s)
        if isinstance(answer, dict) and "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    async def run(self, jobs: Sequence[Job], before_go: Callable[[], Awaitable[None]]) -> list[Result]:
        """Hand out the jobs, wait until all are ready, await `before_go`, say go, collect the
        results in the order of `jobs`."""
        if len(jobs) > len(self.conns):
            raise ValueError(f"{len(jobs)} jobs for {len(self.conns)} processes")
        conns = self.conns[: len(jobs)]
        for conn, job in zip(conns, jobs, strict=True):
            conn.send(job)
        for conn in conns:
            if await self._answer(conn, READY_TIMEOUT_S) != "ready":
                raise RuntimeError("a benchmark process did not get ready")
        await before_go()
        for conn in conns:
            conn.send("go")
        return [await self._answer(conn, RUN_TIMEOUT_S + 30) for conn in conns]
