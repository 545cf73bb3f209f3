"""The write path's two sides for `fanout bench cluster` and `fanout bench instructions`, in child processes.

The ceiling (`insert_raw_batch`: plain asyncpg writing the rows the persister writes, its way) and
the write path (`drive_persister`: an in-process persister driven by many concurrent senders) run
in spawned processes, one per writer, started together by `in_processes` so a phase measures what
those processes did together.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Sequence
from queue import Empty
from typing import TYPE_CHECKING, Any

import asyncpg

from workers import identifiers
from workers.config import WorkerConfig
from workers.handlers.rooms import rules as rooms
from workers.harness.bench._common import progress
from workers.model import NewEvent
from workers.process import event_loop
from workers.routing import writer_for_room
from workers.storage import connect
from workers.storage.events import copy_event_rows

if TYPE_CHECKING:
    from workers.app import Worker

# -- phase 1: the ceiling ------------------------------------------------------------------------


def bench_rooms(owned_by: str | None = None, writers: Sequence[str] = ()) -> list[str]:
    """The 16 rooms a write-path sender (or the ceiling) spreads its messages over; with
    `owned_by`, rooms that writer owns among `writers`."""
    found: list[str] = []
    while len(found) < 16:
        room = identifiers.new_room_id("bench.local")
        if owned_by is None or writer_for_room(room, writers) == owned_by:
            found.append(room)
    return found


async def insert_raw_batch(conn: asyncpg.Connection, batch: int, name: str, room_ids: Sequence[str]) -> None:
    """One batch of the ceiling: `batch` IDs in one query, then the persister's binary COPY
    (`copy_event_rows`; also the faster of the two raw ways for PostgreSQL: 5% more rows/s than
    `INSERT ... SELECT unnest`) in one transaction. The rows are the write path's: random
    event IDs from the same generator (the unique index costs PostgreSQL twice as much per row for
    random IDs as for ascending ones), rooms spread the same way, stored JSON of the same size;
    built as cheaply as Python allows."""
    async with conn.transaction():
        ids = [
            r[0]
            for r in await conn.fetch(
                "SELECT nextval('events_stream_seq') FROM generate_series(1, $1)", batch
            )
        ]
        now = int(time.time() * 1000)
        new_event_id = rooms.new_event_id
        rows = []
        for i in ids:
            event_id, room = new_event_id(), room_ids[i % len(room_ids)]
            rows.append(
                (i, name, event_id, room, "m.room.message", None, "@bench",
                 f'{{"event_id":"{event_id}","room_id":"{room}","type":"m.room.message",'
                 f'"sender":"@bench","content":{{"n":{i}}},"origin_server_ts":{now},'
                 f'"stream_ordering":{i},"instance_name":"{name}"}}', now)
            )  # fmt: skip
        await copy_event_rows(conn, rows)


async def _ceiling_child(database_url: str, seconds: float, batch: int, name: str, connections: int) -> int:
    """`connections` connections each inserting batches back to back (as many as the persister
    has batches in flight), until `seconds` are up; returns the rows inserted."""
    room_ids = bench_rooms()
    deadline = time.monotonic() + seconds

    async def inserter() -> int:
        done = 0
        async with connect(database_url) as conn:
            while time.monotonic() < deadline:
                await insert_raw_batch(conn, batch, name, room_ids)
                done += batch
        return done

    return sum(await asyncio.gather(*(inserter() for _ in range(connections))))


# -- phase 2 and 5: the write path in a child process ---------------------------------------------


async def _write_path_child(
    database_url: str, redis_url: str, prefix: str, name: str, writers: list[str], seconds: float,
    events: int, concurrency: int, serve_reads: bool = False,
    other_writers: dict[str, list[str]] | None = None,
) -> int:  # fmt: skip
    """`other_writers`: the writers of the other streams, when the cluster around has some."""
    from workers.app import Worker

    config = WorkerConfig(
        instance_name=name, database_url=database_url, redis_url=redis_url, channel_prefix=prefix,
        stream_writers={**(other_writers or {}), "events": writers}, http_port=0, log_level="WARNING",
        serve_reads=serve_reads,
    )  # fmt: skip
    worker = Worker(config)
    await worker.start()
    assert worker.persister is not None
    persister = worker.persister
    try:
        return await drive_persister(worker, name, writers, time.monotonic() + seconds, events, concurrency)
    finally:
        progress(f"{name}: {persister.events} events in {persister.batches} batches")
        await worker.stop()


async def drive_persister(
    worker: Worker, name: str, writers: list[str], deadline: float, events: int, concurrency: int
) -> int:
    """`concurrency` tasks each persisting one message at a time into rooms this writer owns, until
    `deadline` or `events` sent (0: no limit); returns how many were sent. The rooms' leases are
    taken first, as the worker's first write to each would take them."""
    persister = worker.persister
    assert persister is not None
    owned = bench_rooms(name, writers)
    if worker.room_leases is not None:
        for room in owned:
            await worker.room_leases.hold(room)
    done = 0

    async def sender(index: int) -> None:
        nonlocal done
        while time.monotonic() < deadline and (events == 0 or done < events):
            done += 1
            room = owned[(index + done) % len(owned)]
            await persister.persist(
                NewEvent(rooms.new_event_id(), room, "m.room.message", "@bench", {"n": done})
            )

    await asyncio.gather(*(sender(i) for i in range(concurrency)))
    return done


def _child_main(kind: str, args: tuple[Any, ...], queue: Any) -> None:
    if kind == "ceiling":
        queue.put(event_loop.run(_ceiling_child(*args)))
    else:
        queue.put(event_loop.run(_write_path_child(*args)))


def in_processes(kind: str, arg_sets: list[tuple[Any, ...]]) -> tuple[int, float]:
    """Run one child per argument set at once; (total count, wall seconds)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    started = time.monotonic()
    procs = [ctx.Process(target=_child_main, args=(kind, a, queue)) for a in arg_sets]
    for p in procs:
        p.start()
    total, results = 0, 0
    while results < len(procs):
        try:
            total += queue.get(timeout=1.0)
            results += 1
        except Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed:
                for p in procs:
                    p.kill()
                raise RuntimeError(
                    f"a {kind} child failed with exit code {failed[0]} (its error is above)"
                ) from None
    for p in procs:
        p.join()
    return total, time.monotonic() - started


# -- phase 3 and 4: HTTP ------------------------------------------------------------------------------
