"""Where an event becomes visible, seen from a process of its own (the latency phase of `bench cluster`).

The observer runs apart from the senders, so the load generator's event loop (a thousand requests
a second) never delays what it records. It holds one probe user per sync worker, joined to every
room and long-polling that worker, and a plain subscriber on the cluster's channel. Per event it
records when its RDATA line reached the channel's subscribers and when each probe's `/sync` brought
it. Against the event's `received_ts` (the persister's clock when the batch began) that splits
persist-to-visible into the writer's half (persist and publish) and the reader's half (apply, wake,
answer).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from pubsub.wire import RData, parse_line
from workers.harness.bench._common import percentile, progress
from workers.harness.cluster_client import ClusterClient, timeline_events
from workers.process import event_loop
from workers.streams.events import EVENTS, EventRow


@dataclass
class Arrivals:
    """When each event id was seen: on the channel, and by each sync worker's probe."""

    published: dict[str, float] = field(default_factory=dict)
    visible: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Split:
    """Percentiles (ms) of persist-to-visible and of its two halves, over events every probe saw."""

    samples: int
    total: tuple[float, float]
    to_channel: tuple[float, float]
    channel_to_visible: tuple[float, float]

    @classmethod
    def of(cls, received_ms: dict[str, int], arrivals: Arrivals, probes: int) -> Split:
        total, to_channel, after = [], [], []
        for event_id, received in received_ms.items():
            seen = arrivals.visible.get(event_id, [])
            published = arrivals.published.get(event_id)
            if len(seen) != probes:
                continue
            visible_ms = max(seen) * 1000
            total.append(max(0.0, visible_ms - received))
            if published is not None:
                to_channel.append(max(0.0, published * 1000 - received))
                after.append(max(0.0, visible_ms - published * 1000))

        def p50_p99(values: list[float]) -> tuple[float, float]:
            return (round(percentile(values, 50), 2), round(percentile(values, 99), 2))

        return cls(len(total), p50_p99(total), p50_p99(to_channel), p50_p99(after))


class Observer:
    """The observer process: `start` (returns once every probe holds a poll), then `stop`."""

    def __init__(
        self, urls: dict[str, str], writers: Sequence[str], sync_workers: Sequence[str],
        rooms: Sequence[str], redis_url: str, channel_prefix: str,
    ) -> None:  # fmt: skip
        self._args = (dict(urls), list(writers), list(sync_workers), list(rooms), redis_url, channel_prefix)
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None

    async def start(self, timeout_s: float = 60.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        self._conn = ours
        self._process = ctx.Process(target=_observe, args=(*self._args, theirs), daemon=True)
        self._process.start()
        if not await asyncio.get_running_loop().run_in_executor(None, ours.poll, timeout_s):
            raise RuntimeError("the latency observer did not get ready")
        ready = ours.recv()
        if ready != "ready":
            raise RuntimeError(f"the latency observer failed: {ready}")

    async def stop(self) -> Arrivals:
        assert self._conn is not None and self._process is not None
        self._conn.send("stop")
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(None, self._conn.recv)
        await loop.run_in_executor(None, self._process.join)
        data = json.loads(text)
        return Arrivals(data["published"], data["visible"])


def _observe(
    urls: dict[str, str], writers: list[str], sync_workers: list[str], rooms: list[str],
    redis_url: str, prefix: str, conn: Connection,
) -> None:  # fmt: skip
    try:
        event_loop.run(_observe_async(urls, writers, sync_workers, rooms, redis_url, prefix, conn))
    except Exception as e:  # told to the parent, which fails the phase with it
        conn.send(f"{type(e).__name__}: {e}")


async def _observe_async(
    urls: dict[str, str], writers: list[str], sync_workers: list[str], rooms: list[str],
    redis_url: str, prefix: str, conn: Connection,
) -> None:  # fmt: skip
    arrivals = Arrivals()
    stop = asyncio.Event()
    redis = aioredis.Redis.from_url(redis_url)
    pubsub = redis.pubsub()
    await pubsub.psubscribe(f"{prefix}*")

    async def listen() -> None:
        while not stop.is_set():
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is None or message["type"] != "pmessage":
                continue
            now = time.time()
            command = parse_line(message["data"])
            if isinstance(command, RData) and command.stream == EVENTS:
                fields: list[Any] = json.loads(command.row_json)
                # A token's last row starts with the previous token and the row count
                # (`Stream.encode_payload`).
                row = EventRow(*fields[2:] if command.token is not None else fields)
                arrivals.published.setdefault(row.event_id, now)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tokens = []
        probes = []
        for worker in sync_workers:
            probe = ClusterClient(session, urls, writers)
            await probe.register(f"@probe-{worker}-{uuid.uuid4().hex[:8]}")
            for room in rooms:
                await probe.membership(room, "join")
            tokens.append((await probe.sync(worker))["next_batch"])
            probes.append((probe, worker))

        async def follow(probe: ClusterClient, worker: str, token: str) -> None:
            while not stop.is_set():
                result = await probe.sync(worker, token, 500)
                now = time.time()
                for event in timeline_events(result):
                    arrivals.visible.setdefault(event["event_id"], []).append(now)
                token = result["next_batch"]

        tasks = [asyncio.create_task(listen())]
        tasks += [asyncio.create_task(follow(p, w, t)) for (p, w), t in zip(probes, tokens, strict=True)]
        conn.send("ready")
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        stop.set()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, Exception):
                progress(f"latency observer: {type(outcome).__name__}: {outcome}")
    await pubsub.aclose()  # type: ignore[no-untyped-call]
    await redis.aclose()
    conn.send(json.dumps({"published": arrivals.published, "visible": arrivals.visible}))
