"""The one driver of the peer run: the same client code, on the same Matrix paths, for every target.

Paths: `POST /register` (m.login.dummy), `POST /createRoom` (public_chat), `POST /join/{room}`,
`PUT /rooms/{room}/send/m.room.message/{txnId}` (a new txnId per send), `GET /sync` with an
inline filter (`timeline.limit` 100) and `since`, long-polled with `timeout=30000`. Where each
path goes is the target's (`targets.py`). Two phases:

* `saturate`: `senders` closed-loop senders (each sends again as soon as its send is answered),
  sender i in room i mod rooms, after `warmup_s` for `seconds`, each on a keep-alive connection
  of its own (`sends.Sender`: raw HTTP/1.1, so that the driver's CPU per send is a few tens of
  microseconds, not aiohttp's third of a millisecond). Counted: sends answered 200 within the
  window; CPU seconds of each process group (`cpu.Accounts`) and of the driver itself
  (`time.process_time`) over the window.
* `latency`: sends at `rate` a second on a fixed schedule (open loop: a send starts at its time
  whether or not the one before was answered), round-robin over the rooms, each carrying a
  marker; each room's reader long-polls the sync target. Per send: start -> seen (the reader's
  answer carrying it arrived) and answered -> seen, CLOCK_MONOTONIC; CPU from the first send
  until the last one seen (or `GRACE_S` after the last answer).

One asyncio process; its own CPU share (cores used over the window) is reported with each phase,
so a phase the driver bounds shows it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from workers.harness.bench._common import latency_ms, progress
from workers.harness.bench.peer.cpu import Accounts, spent
from workers.harness.bench.peer.sends import Sender
from workers.harness.bench.peer.targets import Target
from workers.harness.bench.profile import Profiles

CLIENT = "/_matrix/client/v3"
MARK = "peer:"
FILTER = quote(json.dumps({"room": {"timeline": {"limit": 100}}}, separators=(",", ":")))
POLL_TIMEOUT_MS = 30_000
#: How long after the last send's answer the readers have to bring every send.
GRACE_S = 5.0
#: Setup requests in flight at once.
PARALLEL = 8


@dataclass(frozen=True)
class RoomPair:
    """A room with its sender's and its reader's access tokens."""

    room_id: str
    sender: str
    reader: str


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _json(resp: aiohttp.ClientResponse, what: str) -> dict[str, Any]:
    if resp.status != 200:
        raise RuntimeError(f"{what}: HTTP {resp.status}: {(await resp.text())[:300]}")
    body: dict[str, Any] = await resp.json()
    return body


async def setup_rooms(target: Target, rooms: int) -> list[RoomPair]:
    """`rooms` rooms, each made by a new sender and joined by a new reader, on `target`."""
    base, tag = target.client_url() + CLIENT, uuid.uuid4().hex[:6]
    limit = asyncio.Semaphore(PARALLEL)
    async with aiohttp.ClientSession() as http:

        async def register(name: str) -> str:
            body = {"username": name, "password": uuid.uuid4().hex, "auth": {"type": "m.login.dummy"}}
            async with limit, http.post(f"{base}/register", json=body) as resp:
                return str((await _json(resp, "register"))["access_token"])

        async def pair(i: int) -> RoomPair:
            sender, reader = await register(f"s{i}x{tag}"), await register(f"r{i}x{tag}")
            async with (
                limit,
                http.post(
                    f"{base}/createRoom", json={"preset": "public_chat"}, headers=_auth(sender)
                ) as resp,
            ):
                room_id = str((await _json(resp, "createRoom"))["room_id"])
            async with (
                limit,
                http.post(f"{base}/join/{quote(room_id, safe='')}", json={}, headers=_auth(reader)) as resp,
            ):
                await _json(resp, "join")
            return RoomPair(room_id, sender, reader)

        return list(await asyncio.gather(*(pair(i) for i in range(rooms))))


def bare_rooms(rooms: int) -> list[RoomPair]:
    """The bare server's rooms: it keeps no users; a reader's token names its room."""
    ids = [f"!peer{i}:bare" for i in range(rooms)]
    return [RoomPair(r, "sender", f"room:{r}") for r in ids]


def _send_route(room_id: str) -> str:
    """The send path of `room_id` up to its txnId."""
    return f"{CLIENT}/rooms/{quote(room_id, safe='')}/send/m.room.message/"


def _send_path(target: Target, room_id: str) -> str:
    return target.send_url(room_id) + _send_route(room_id)


def _cpu_result(cpu: dict[str, float], driver_s: float, wall_s: float, events: int) -> dict[str, Any]:
    per = (lambda s: round(s / events * 1000, 3)) if events else (lambda s: float("nan"))
    services = cpu.get("postgres", 0.0) + cpu.get("redis", 0.0)
    return {
        "cpu_s": {**cpu, "driver": round(driver_s, 3)},
        "cpu_s_per_1000": {"servers": per(cpu["servers"]), "postgres_redis": per(services)},
        "driver_cores": round(driver_s / wall_s, 3) if wall_s else float("nan"),
        "server_cores": round(cpu["servers"] / wall_s, 3) if wall_s else float("nan"),
    }


def _written(recording: Profiles | None) -> None:
    """End a phase's CPU recording (after its window was measured) and name the summaries."""
    for summary in () if recording is None else recording.wait():
        progress(f"    profile: {summary}")


async def saturate(
    target: Target,
    pairs: list[RoomPair],
    accounts: Accounts,
    *,
    senders: int,
    seconds: float,
    warmup_s: float,
    profile: Callable[[], Profiles] | None = None,
) -> dict[str, Any]:
    """Closed-loop sends for `warmup_s` + `seconds`; counted over the last `seconds`. `profile`
    starts a CPU recording of the servers at the window's start; it is written after its end."""
    tag = uuid.uuid4().hex[:6]
    answered = errors = 0
    started = time.monotonic()
    window_start, window_end = started + warmup_s, started + warmup_s + seconds
    content = {"msgtype": "m.text", "body": "peer"}
    clients = [
        Sender(target.send_url(p.room_id), _send_route(p.room_id), p.sender, content)
        for p in (pairs[i % len(pairs)] for i in range(senders))
    ]
    await asyncio.gather(*(client.open() for client in clients))
    try:

        async def sender(i: int) -> None:
            nonlocal answered, errors
            client, n = clients[i], 0
            while time.monotonic() < window_end:
                n += 1
                status = await client.send(f"{tag}x{i}x{n}")
                done = time.monotonic()
                if window_start <= done <= window_end:
                    if status == 200:
                        answered += 1
                    else:
                        errors += 1

        async def window() -> tuple[dict[str, float], float, float]:
            await asyncio.sleep(window_start - time.monotonic())
            recording = None if profile is None else profile()
            before, driver_before, t0 = accounts.sample(), time.process_time(), time.monotonic()
            await asyncio.sleep(window_end - time.monotonic())
            cpu = spent(before, accounts.sample())
            measured = cpu, time.process_time() - driver_before, time.monotonic() - t0
            _written(recording)
            return measured

        sending = [asyncio.create_task(sender(i)) for i in range(senders)]
        cpu, driver_s, wall_s = await window()
        await asyncio.gather(*sending)
    finally:
        for client in clients:
            client.close()
    return {
        "senders": senders,
        "seconds": round(wall_s, 2),
        "sends_answered": answered,
        "errors": errors,
        "sends_per_s": round(answered / wall_s, 1),
        **_cpu_result(cpu, driver_s, wall_s, answered),
    }


async def _reader(http: aiohttp.ClientSession, url: str, pair: RoomPair, seen: dict[int, float]) -> None:
    headers = _auth(pair.reader)
    async with http.get(f"{url}{CLIENT}/sync?timeout=0&filter={FILTER}", headers=headers) as resp:
        since = str((await _json(resp, "initial sync"))["next_batch"])
    while True:
        query = f"since={quote(since)}&timeout={POLL_TIMEOUT_MS}&filter={FILTER}"
        async with http.get(f"{url}{CLIENT}/sync?{query}", headers=headers) as resp:
            body = await _json(resp, "sync")
        arrived = time.monotonic()
        since = str(body["next_batch"])
        room = body.get("rooms", {}).get("join", {}).get(pair.room_id, {})
        for event in room.get("timeline", {}).get("events", []):
            text = event.get("content", {}).get("body", "")
            if isinstance(text, str) and text.startswith(MARK):
                seen.setdefault(int(text.removeprefix(MARK).partition(":")[0]), arrived)


async def latency(
    target: Target,
    pairs: list[RoomPair],
    accounts: Accounts,
    *,
    rate: float,
    seconds: float,
    profile: Callable[[], Profiles] | None = None,
) -> dict[str, Any]:
    """Sends at `rate`/s for `seconds`, each timed from its start (and its answer) to being seen;
    `profile` as `saturate`'s, over the sends and the wait for the last to be seen."""
    total = max(1, round(rate * seconds))
    tag = uuid.uuid4().hex[:6]
    seen: dict[int, float] = {}
    starts: dict[int, float] = {}
    answers: dict[int, float] = {}
    failed = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        readers = [asyncio.create_task(_reader(http, target.sync_url(), p, seen)) for p in pairs]
        await asyncio.sleep(1.0)  # every reader past its initial sync and long-polling

        async def send(n: int, at: float) -> None:
            nonlocal failed
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            pair = pairs[n % len(pairs)]
            starts[n] = time.monotonic()
            body = {"msgtype": "m.text", "body": f"{MARK}{n}:{tag}"}
            async with http.put(
                f"{_send_path(target, pair.room_id)}{tag}x{n}", json=body, headers=_auth(pair.sender)
            ) as resp:
                await resp.read()
                if resp.status == 200:
                    answers[n] = time.monotonic()
                else:
                    failed += 1

        for task in readers:
            if task.done():
                task.result()  # a reader that failed at once raises here
        recording = None if profile is None else profile()
        before, driver_before, t0 = accounts.sample(), time.process_time(), time.monotonic()
        await asyncio.gather(*(send(n, t0 + n / rate) for n in range(total)))
        deadline = time.monotonic() + GRACE_S
        while any(n not in seen for n in answers) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        cpu = spent(before, accounts.sample())
        driver_s, wall_s = time.process_time() - driver_before, time.monotonic() - t0
        _written(recording)
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    found = [n for n in answers if n in seen]
    return {
        "rate": rate,
        "sent": total,
        "failed": failed,
        "missing": len(answers) - len(found),
        "start_seen": latency_ms([(seen[n] - starts[n]) * 1000 for n in found]),
        "answered_seen": latency_ms([(seen[n] - answers[n]) * 1000 for n in found]),
        "send_answered": latency_ms([(answers[n] - starts[n]) * 1000 for n in answers]),
        **_cpu_result(cpu, driver_s, wall_s, len(answers)),
    }
