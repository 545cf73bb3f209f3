"""`fanout bench instructions`: CPU instructions per persisted and per received event, by callgrind.

Throughput on a shared machine moves by a third from one run to the next; instruction counts do
not (the same code gives the same count to within about 1%: batches differ a little per run). So
this is the measure to compare two versions of the write path. Each kind runs in its own process
under `valgrind --tool=callgrind` with instrumentation off; the process switches it on
(`callgrind_control -i on`) around the measured part only, after a warm-up, and off again:

* write path: an in-process Worker's EventPersister, driven as in `fanout bench cluster` (tasks
  each persisting one message at a time), `--events` events;
* receive path: a worker applying another persister's events as they come from Redis (a sync
  worker, or a persister that serves reads): the RDATA lines that writer would publish (made and
  packed before counting starts) are published from a raw socket, a batch at a time, each once
  the previous one is applied;
* follow path: the same lines heard by a persister that serves no reads (`serve_reads: false`,
  as deployed): it only takes each line's token as the writer's position. With 2 persisters,
  every event costs the write path on its writer and the follow path on the other;
* ceiling: the same process doing `fanout bench cluster`'s raw batched insert for as many rows:
  the client side of the cheapest way to put these rows in the database.

Under valgrind the client is about 50 times slower while the servers are not, so batches are
always full: the counts describe a persister under load. Needs valgrind (Debian: valgrind).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pubsub import keys
from pubsub.redis_transport import pack_publishes
from pubsub.streams import Stream
from pubsub.wire import format_rdata
from workers.embedded.services import given_or_embedded
from workers.handlers.rooms import rules as rooms
from workers.handlers.rooms.persist import MAX_BATCH
from workers.harness.bench._common import Figure, progress, scratch_database
from workers.harness.bench.write_path import bench_rooms, drive_persister, insert_raw_batch
from workers.model import Event
from workers.process import event_loop
from workers.storage import connect
from workers.streams.events import EVENTS, row_json

#: What is counted, each in its own process and database (see the module docstring).
KINDS = ("write", "receive", "follow", "ceiling")


def _instrument(on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], capture_output=True, check=True
    )


async def _measure_write_path(database_url: str, redis_url: str, events: int, concurrency: int) -> None:
    from workers.app import Worker
    from workers.config import WorkerConfig

    config = WorkerConfig(
        instance_name="p1", database_url=database_url, redis_url=redis_url,
        channel_prefix=f"instr-{uuid.uuid4().hex[:6]}", stream_writers={"events": ["p1"]}, http_port=0,
        log_level="WARNING",
    )  # fmt: skip
    worker = Worker(config)
    await worker.start()
    assert worker.persister is not None
    try:
        far = asyncio.get_running_loop().time() + 10**6
        await drive_persister(worker, "p1", ["p1"], far, max(1000, events // 4), concurrency)
        _instrument(True)
        await drive_persister(worker, "p1", ["p1"], far, events, concurrency)
        _instrument(False)
    finally:
        await worker.stop()


async def _measure_receive(database_url: str, redis_url: str, events: int, serve_reads: bool) -> None:
    from workers.app import Worker
    from workers.config import WorkerConfig

    prefix = f"instr-{uuid.uuid4().hex[:6]}"
    config = WorkerConfig(
        instance_name="p2", database_url=database_url, redis_url=redis_url, channel_prefix=prefix,
        stream_writers={"events": ["p1", "p2"]}, http_port=0, log_level="ERROR", serve_reads=serve_reads,
    )  # fmt: skip
    worker = Worker(config)
    await worker.start()
    stream = worker.replication.read_streams[EVENTS]
    channel = keys.base_channel(prefix)
    applied = asyncio.Event()

    def moved(name: str, instance: str, token: int) -> None:
        if name == EVENTS and instance == "p1":
            applied.set()

    worker.replication.add_position_listener(moved)
    room_ids = bench_rooms()
    start = stream.current_token("p1")
    warm_up = max(MAX_BATCH, events // 4)
    # The lines stand for IDs p1 took from the sequence: take them, or readers refuse the tokens
    # (no writer can be past the sequence).
    await worker.pool.execute("SELECT setval('events_stream_seq', $1)", start + warm_up + events)
    lines = [(channel, f"POSITION events p1 {start} {start}")]
    for token in range(start + 1, start + warm_up + events + 1):
        event = Event(token, "p1", rooms.new_event_id(), room_ids[token % len(room_ids)], "m.room.message",
                      "@bench", {"n": token}, None, 0)  # fmt: skip
        payload = Stream.encode_payload(row_json(event, "10"), token - 1, 1)
        lines.append((channel, format_rdata(EVENTS, "p1", token, payload)))
    # (RESP of the PUBLISH commands, how many, the last token they carry)
    chunks = [(*pack_publishes(b"PUBLISH", [lines[0]])[:2], start)]
    for first in range(1, len(lines), MAX_BATCH):
        part = lines[first : first + MAX_BATCH]
        chunks.append((*pack_publishes(b"PUBLISH", part)[:2], start + first + len(part) - 1))
    where = urlsplit(redis_url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        for number, (packed, count, last) in enumerate(chunks):
            if number == 1 + warm_up // MAX_BATCH:
                _instrument(True)
            applied.clear()
            writer.write(packed)
            while stream.current_token("p1") < last:
                await applied.wait()
                applied.clear()
            replies = b""
            while replies.count(b"\n") < count:  # one integer reply per PUBLISH
                replies += await reader.read(65536)
        _instrument(False)
    finally:
        writer.close()
        await worker.stop()


async def _measure_ceiling(database_url: str, events: int) -> None:
    room_ids = bench_rooms()
    async with connect(database_url) as conn:
        for _ in range(5):
            await insert_raw_batch(conn, MAX_BATCH, "c0", room_ids)
        _instrument(True)
        for _ in range(events // MAX_BATCH):
            await insert_raw_batch(conn, MAX_BATCH, "c0", room_ids)
        _instrument(False)


def _child(argv: list[str]) -> int:
    kind, database_url, redis_url, events, concurrency = argv
    if kind == "write":
        event_loop.run(_measure_write_path(database_url, redis_url, int(events), int(concurrency)))
    elif kind in ("receive", "follow"):
        event_loop.run(_measure_receive(database_url, redis_url, int(events), kind == "receive"))
    else:
        event_loop.run(_measure_ceiling(database_url, int(events)))
    return 0


def _count(kind: str, database_url: str, redis_url: str, events: int, concurrency: int) -> int:
    """Run one kind under callgrind; the instructions it counted while switched on."""
    with tempfile.TemporaryDirectory(prefix="fanout-callgrind-") as tmp:
        command = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={Path(tmp) / 'callgrind.out'}",
            sys.executable, "-m", "workers.harness.bench.instructions", "--child",
            kind, database_url, redis_url, str(events), str(concurrency),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{kind} under callgrind failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return int(found.group(1))


async def _databases(admin_url: str) -> list[str]:
    return [await scratch_database(admin_url, f"instr_{kind}") for kind in KINDS]


def figures(result: dict[str, Any]) -> list[Figure]:
    """Instructions per event (lower is better; no target: the figure to compare two versions by)."""
    ceiling = result["ceiling_client_instructions_per_row"]
    return [
        Figure(
            "instructions",
            "write path per event (ceiling: raw insert, client side)",
            result["write_path_instructions_per_event"],
            "instr",
            ceiling,
        ),
        Figure(
            "instructions", "receive path per event", result["receive_path_instructions_per_event"], "instr"
        ),
        Figure(
            "instructions", "follow path per event", result["follow_path_instructions_per_event"], "instr"
        ),
    ]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    p = argparse.ArgumentParser(prog="fanout bench instructions", description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", help="an admin URL (benchmark databases are created on it)")
    p.add_argument("--redis-url")
    p.add_argument("--events", type=int, default=20_000, help="measured events (and ceiling rows)")
    p.add_argument("--concurrency", type=int, default=256, help="concurrent senders on the write path")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("fanout bench instructions: needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    with given_or_embedded(args.database_url, args.redis_url) as (admin_url, redis_url):
        counts = {}
        for kind, db in zip(KINDS, event_loop.run(_databases(admin_url)), strict=True):
            progress(
                f"{kind} under callgrind: {args.events:,} {'rows' if kind == 'ceiling' else 'events'} ..."
            )
            counts[kind] = _count(kind, db, redis_url, args.events, args.concurrency)
    result = {
        "events": args.events,
        "write_path_instructions_per_event": round(counts["write"] / args.events),
        "receive_path_instructions_per_event": round(counts["receive"] / args.events),
        "follow_path_instructions_per_event": round(counts["follow"] / args.events),
        "ceiling_client_instructions_per_row": round(
            counts["ceiling"] / (args.events // MAX_BATCH * MAX_BATCH)
        ),
    }
    result["ratio"] = round(
        result["write_path_instructions_per_event"] / result["ceiling_client_instructions_per_row"], 2
    )
    print(json.dumps(result, indent=2))
    print(
        f"instructions per event: write path {result['write_path_instructions_per_event']:,},"
        f" raw batched insert (client side) {result['ceiling_client_instructions_per_row']:,}"
        f" ({result['ratio']}x); receive path (a worker applying it)"
        f" {result['receive_path_instructions_per_event']:,}; follow path (another persister,"
        f" serving no reads) {result['follow_path_instructions_per_event']:,}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
