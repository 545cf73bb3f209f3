"""Long-polling clients in processes of their own, as Matrix clients behave: each `/sync` re-issued
with the `next_batch` it returned, as soon as it returns.

`PollClients` spreads the polls over `processes` processes (spawned, each on the workers' event
loop), so that the client side is not what limits a benchmark. Each process opens its share at
`open_per_s / processes` a second, then keeps every poll going until closed. It counts the
answers (and the failed requests) and, for the polls marked `measured`, records each event whose
body starts with `MARK` with the time its answer arrived (CLOCK_MONOTONIC: the same clock in every
process of the machine, so the parent compares it with its own send times). Each process also
reports its own CPU time (user + system, every thread), so that a benchmark can show the client
side's CPU per answer and that no client process is saturated.

The file-descriptor limit of a client process is raised to its hard limit by `raise_fd_limit`
(the benchmarks raise their own too, so the workers they start inherit it).
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import quote

import aiohttp

from workers.harness.bench._processes import ProcessPool
from workers.process import event_loop

CLIENT = "/_matrix/client/v3"
#: Event bodies the clients record: `MARK` then what the benchmark needs to match it to its send.
MARK = "bench:"
#: Every poll asks for up to this many events per room, so that none is cut by `limited`.
FILTER = quote(json.dumps({"room": {"timeline": {"limit": 1000}}}, separators=(",", ":")))


def raise_fd_limit() -> int:
    """Raise this process's soft file-descriptor limit to its hard limit; return the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


@dataclass(frozen=True)
class Poll:
    """One long-poll kept going: its access token, its first `since` ("" for none), and whether
    the marked events it brings are recorded."""

    token: str
    since: str
    measured: bool = False


#: A recorded event: (the body after MARK, the arrival time, the index of the poll that got it).
Seen = tuple[str, float, int]


@dataclass(frozen=True)
class ClientUsage:
    """What one client process has done so far: answers received, requests failed, and its CPU
    seconds (user + system, all its threads)."""

    answers: int
    failed: int
    cpu_s: float


def cpu_seconds() -> float:
    """This process's CPU time so far, user + system, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class PollClients:
    """`processes` client processes keeping `polls` going against `sync_url`."""

    def __init__(
        self, sync_url: str, polls: list[Poll], processes: int, *, timeout_ms: int, open_per_s: float
    ) -> None:
        self.count = len(polls)
        self._pool = ProcessPool(_client_main, processes)
        for i, conn in enumerate(self._pool.conns):
            share = [(n, p.token, p.since, p.measured) for n, p in enumerate(polls) if n % processes == i]
            conn.send((sync_url, share, timeout_ms, open_per_s / processes))

    async def _ask(self, command: str, timeout_s: float) -> list[Any]:
        for conn in self._pool.conns:
            conn.send(command)
        return [await self._pool.recv(conn, timeout_s) for conn in self._pool.conns]

    async def opened(self, timeout_s: float = 600) -> None:
        """Once every process has sent its first request of every poll."""
        for conn in self._pool.conns:
            if await self._pool.recv(conn, timeout_s) != "opened":
                raise RuntimeError("a client process did not open its polls")

    async def usage(self) -> list[ClientUsage]:
        """Each process's answers, failures and CPU time so far, in process order."""
        return [ClientUsage(*counts) for counts in await self._ask("count", 30)]

    async def answers(self) -> tuple[int, int]:
        """(answers received, requests failed) so far, over every process."""
        usage = await self.usage()
        return sum(u.answers for u in usage), sum(u.failed for u in usage)

    async def seen(self) -> list[Seen]:
        """Every marked event the measured polls have brought so far."""
        found: list[Seen] = []
        for part in await self._ask("seen", 60):
            found += part
        return found

    def close(self) -> None:
        self._pool.close()


def _client_main(conn: Connection) -> None:
    raise_fd_limit()
    sync_url, polls, timeout_ms, open_per_s = conn.recv()
    event_loop.run(_keep_polling(conn, sync_url, polls, timeout_ms, open_per_s))


async def _keep_polling(
    conn: Connection,
    sync_url: str,
    polls: list[tuple[int, str, str, bool]],
    timeout_ms: int,
    open_per_s: float,
) -> None:
    counts = [0, 0]  # answers, failures
    seen: list[Seen] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_ms / 1000 + 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def follow(index: int, token: str, since: str, measured: bool) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            while True:
                url = f"{sync_url}?timeout={timeout_ms}&filter={FILTER}"
                try:
                    async with http.get(
                        url + (f"&since={quote(since)}" if since else ""), headers=headers
                    ) as r:
                        body = await r.read()
                        arrived = time.monotonic()
                        status = r.status
                except (aiohttp.ClientError, TimeoutError):
                    status = 0
                if status != 200:
                    counts[1] += 1
                    await asyncio.sleep(1.0)
                    continue
                counts[0] += 1
                answer = json.loads(body)
                since = answer["next_batch"]
                if measured and MARK.encode() in body:
                    seen.extend((text[len(MARK) :], arrived, index) for text in _marked(answer))

        tasks = []
        started = time.monotonic()
        for n, poll in enumerate(polls):
            tasks.append(asyncio.create_task(follow(*poll)))
            await asyncio.sleep(max(0.0, started + (n + 1) / open_per_s - time.monotonic()))
        conn.send("opened")
        loop = asyncio.get_running_loop()
        while (command := await loop.run_in_executor(None, conn.recv)) is not None:
            if command == "count":
                conn.send((*counts, cpu_seconds()))
            elif command == "seen":
                conn.send(seen)
                seen = []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _marked(answer: dict[str, Any]) -> list[str]:
    texts = []
    for room in answer.get("rooms", {}).get("join", {}).values():
        for event in room.get("timeline", {}).get("events", []):
            body = event.get("content", {}).get("body")
            if isinstance(body, str) and body.startswith(MARK):
                texts.append(body)
    return texts


async def sync_waiting(http: aiohttp.ClientSession, base: str) -> float:
    """The long-polls a sync worker (or the bare server) holds now (`fanout_sync_waiting`)."""
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return next(
        (float(line.split()[-1]) for line in text.splitlines() if line.startswith("fanout_sync_waiting ")), 0
    )


async def wait_held(base: str, polls: int, within_s: float = 120) -> float:
    """Wait until `base` holds `polls` long-polls (or `within_s` passes); the count it holds."""
    deadline = time.monotonic() + within_s
    async with aiohttp.ClientSession() as http:
        while True:
            held = await sync_waiting(http, base)
            if held >= polls or time.monotonic() > deadline:
                return held
            await asyncio.sleep(0.5)


async def send_marked(
    http: aiohttp.ClientSession, base: str, room_id: str, token: str, marker: str
) -> tuple[float, float, bool]:
    """PUT one message whose body is `MARK + marker` (a fresh txnId); (started, answered, answered
    200) on CLOCK_MONOTONIC."""
    path = f"{CLIENT}/rooms/{quote(room_id, safe='')}/send/m.room.message/{uuid.uuid4().hex}"
    started = time.monotonic()
    try:
        async with http.put(
            base + path,
            json={"msgtype": "m.text", "body": MARK + marker},
            headers={"Authorization": f"Bearer {token}"},
        ) as r:
            await r.read()
            return started, time.monotonic(), r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return started, time.monotonic(), False
