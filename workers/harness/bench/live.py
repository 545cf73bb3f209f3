"""`fanout bench live`: sends at fixed offered rates, each seen by a reader long-polling a sync worker.

A cluster of 2 persisters and 1 sync worker (`LocalCluster`); `--rooms` rooms (default 10) of 2
users: the first sends (PUT send with a txnId, straight to the room's persister), the second
long-polls `/sync` on the sync worker, re-issuing each poll with its `next_batch` at once
(`poll_clients.py`). For each rate of `--rates` (default 10, 50, 200 and 1,000 events/s offered
in total, then `max`: `--closed-loop` senders back to back, the saturation point), for
`--seconds` each (an open-loop rate at least long enough for `--min-events` events, 300 by
default: 30 s at 10/s), measured:

* the achieved rate: sends answered 200 over the time from the first start to the last answer;
* send 200 -> seen and send start -> seen, p50 and p99: from the send's answer (or its start) to
  the reader's poll answer that brought it arriving (CLOCK_MONOTONIC, shared by the processes);
  sends never seen are counted as missing;
* CPU-seconds per 1,000 events of each worker process and of all of them (user + system from
  /proc, from the first send until the reader has seen the last), and beside them the context
  switches per event (`process_switches`): how often each process was woken, which at a low rate
  is most of what an event costs and moves far less between runs than the CPU does.

The sends come from `--sender-processes` processes (default 4), open loop: each send starts at its
scheduled time whether or not the ones before it were answered (at most `IN_FLIGHT` per process
at once), so a slow server shows as latency, not as a lower offered rate. The ceiling: the same
senders and readers against the bare server of `bare_sync.py`, at every rate: what the load
generator reaches and what it measures when the server costs next to nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

import aiohttp

from workers.harness.bench._common import (
    Figure,
    bench_cluster,
    beside_ceiling,
    latency_ms,
    positive_int,
    process_switches,
    process_usage,
    progress,
)
from workers.harness.bench._processes import ProcessPool
from workers.harness.bench.bare_server import bare_server
from workers.harness.bench.poll_clients import Poll, PollClients, raise_fd_limit, send_marked
from workers.harness.bench.profile import Profiles, recorder, sampled_dir
from workers.harness.bench.room_setup import populate
from workers.process import event_loop
from workers.routing import writer_for_room

TARGET_SEEN_P99_MS = 20.0
TARGET_CPU_AT_10 = 3.0
TARGET_CPU_SATURATED = 0.25
#: Sends in flight at once per sender process (open loop, bounded).
IN_FLIGHT = 256
#: How long after the last send's answer the readers have to bring every send.
GRACE_S = 2.0
#: The fewest events an open-loop rate is run for by default (`--min-events`; 10/s runs 30 s
#: however short `--seconds`): CPU is read from /proc in 10 ms ticks, and the 2-second periodic
#: work of every worker lands a varying number of times in a short window, so 100 events at
#: 10/s moved the CPU per 1,000 events by a fifth from one run to the next.
MIN_EVENTS = 300

#: Where a room's sends go: (the base URL taking them, room id, the sender's token).
Sender = tuple[str, str, str]
#: One send as a sender process saw it: (marker, started, answered, answered 200).
Sent = tuple[str, float, float, bool]


def _sender_main(conn: Connection) -> None:
    while (job := conn.recv()) is not None:
        conn.send(event_loop.run(_send_for(*job)))


async def _send_for(
    rooms: list[Sender], rate: float | None, closed_loop: int, seconds: float, prefix: str
) -> list[Sent]:
    """Send round-robin over `rooms` for `seconds`: at `rate` a second (open loop), or, when
    `rate` is None, from `closed_loop` senders each waiting for its answer."""
    sent: list[Sent] = []
    in_flight = asyncio.Semaphore(IN_FLIGHT)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def one(n: int) -> None:
            base, room, token = rooms[n % len(rooms)]
            async with in_flight:
                sent.append((f"{prefix}{n}", *await send_marked(http, base, room, token, f"{prefix}{n}")))

        started = time.monotonic()
        until = started + seconds
        if rate is not None:
            tasks = []
            n = 0
            while (at := started + n / rate) < until:
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                tasks.append(asyncio.create_task(one(n)))
                n += 1
            await asyncio.gather(*tasks)
        else:
            count = [0]

            async def loop() -> None:
                while time.monotonic() < until:
                    count[0] += 1
                    await one(count[0])

            await asyncio.gather(*(loop() for _ in range(closed_loop)))
    return sent


async def _rates(
    sync_base: str,
    rooms: list[Sender],
    readers: list[Poll],
    pids: Mapping[str, int],
    args: argparse.Namespace,
    record: Callable[[str], Profiles] | None = None,
) -> list[dict[str, Any]]:
    """Every rate in turn against one server (fanout's or the bare one): the readers poll
    `sync_base`, the senders send to each room's base URL, `pids` are the server's processes.
    `record` (a rate's label -> a started recording) profiles the CPU of each rate."""
    clients = PollClients(
        sync_base + "/_matrix/client/v3/sync",
        readers,
        args.reader_processes,
        timeout_ms=30_000,
        open_per_s=1000,
    )
    senders = ProcessPool(_sender_main, args.sender_processes)
    runs = []
    try:
        await clients.opened()
        await asyncio.sleep(0.5)
        for rate in args.rates:
            label = "max" if rate is None else f"{rate:g}/s"
            share = None if rate is None else rate / args.sender_processes
            seconds = duration(rate, args.seconds, args.min_events)
            cpu_before = {name: process_usage(pid)[1] for name, pid in pids.items()}
            switches_before = {name: process_switches(pid) for name, pid in pids.items()}
            closed_loop = max(1, args.closed_loop // args.sender_processes)
            recording = None if record is None else record("max" if rate is None else f"{rate:g}-per-s")
            for i, conn in enumerate(senders.conns):
                ours = rooms[i :: args.sender_processes] or rooms
                conn.send((ours, share, closed_loop, seconds, f"{label}:{i}:"))
            sent: list[Sent] = []
            for conn in senders.conns:
                sent += await senders.recv(conn, seconds + 120)
            seen = await _seen_all(clients, {marker for marker, _, _, ok in sent if ok})
            cpu = {name: process_usage(pid)[1] - cpu_before[name] for name, pid in pids.items()}
            for written in () if recording is None else recording.wait():
                progress(f"  profile: {written}")
            switches = {name: process_switches(pid) - switches_before[name] for name, pid in pids.items()}
            runs.append({**_rate_result(label, rate, sent, seen, cpu, switches), "seconds": seconds})
            run = runs[-1]
            after_200, after_start = run["seen_after_200"], run["seen_after_start"]
            progress(
                f"  {label}: {run['achieved_per_s']:,.0f} events/s achieved, {run['missing']} missing;"
                f" 200 -> seen p50/p99 {after_200['p50_ms']}/{after_200['p99_ms']} ms,"
                f" start -> seen {after_start['p50_ms']}/{after_start['p99_ms']} ms;"
                " CPU-s per 1,000 events: "
                + ", ".join(f"{k} {v}" for k, v in run["cpu_s_per_1000"].items())
                + "; context switches per event: "
                + ", ".join(f"{k} {v}" for k, v in run["switches_per_event"].items())
            )
        _, failed = await clients.answers()
        if failed:
            progress(f"  {failed} /sync requests failed")
    finally:
        senders.close()
        clients.close()
    return runs


def duration(rate: float | None, seconds: float, min_events: int) -> float:
    """How long a rate runs: `seconds`, or for an open-loop rate long enough for `min_events`."""
    return seconds if rate is None else max(seconds, min_events / rate)


async def _seen_all(clients: PollClients, markers: set[str]) -> dict[str, float]:
    """When each of `markers` was seen, waiting until every one was or `GRACE_S` passed."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + GRACE_S
    while not markers <= seen.keys() and time.monotonic() < deadline:
        seen |= {text: arrived for text, arrived, _ in await clients.seen()}
        await asyncio.sleep(0.02)
    return seen


def _rate_result(
    label: str,
    rate: float | None,
    sent: list[Sent],
    seen: Mapping[str, float],
    cpu: Mapping[str, float],
    switches: Mapping[str, int],
) -> dict[str, Any]:
    answered = [s for s in sent if s[3]]
    found = [(seen[marker], start, end) for marker, start, end, _ in answered if marker in seen]
    took = max((s[2] for s in sent), default=0.0) - min((s[1] for s in sent), default=0.0)
    events = len(answered)
    return {
        "rate": label,
        "offered_per_s": rate,
        "sent": len(sent),
        "failed": len(sent) - events,
        "achieved_per_s": round(events / took, 1) if took > 0 else 0.0,
        "missing": events - len(found),
        "seen_after_200": latency_ms([(arrived - end) * 1000 for arrived, _, end in found]),
        "seen_after_start": latency_ms([(arrived - start) * 1000 for arrived, start, _ in found]),
        "cpu_s_per_1000": {
            **{name: round(used / events * 1000, 3) if events else None for name, used in cpu.items()},
            "all": round(sum(cpu.values()) / events * 1000, 3) if events else None,
        },
        "switches_per_event": {
            **{name: round(n / events, 2) if events else None for name, n in switches.items()},
            "all": round(sum(switches.values()) / events, 2) if events else None,
        },
    }


async def _fanout(args: argparse.Namespace, admin_url: str, redis_url: str) -> list[dict[str, Any]]:
    async with bench_cluster(
        admin_url, redis_url, "live", persisters=2, sync_workers=1, cpu_profile=sampled_dir(args.profile)
    ) as cluster:
        base = cluster.url("sync1")
        rooms, _ = await populate(base, args.rooms, 2)
        writers = cluster.event_writers
        senders = [
            (cluster.url(writer_for_room(r.room_id, writers)), r.room_id, r.sender.token) for r in rooms
        ]
        readers = [Poll(r.joined[0].token, r.joined[0].since, True) for r in rooms]
        return await _rates(base, senders, readers, cluster.pids, args, recorder(cluster))


async def _ceiling(args: argparse.Namespace) -> list[dict[str, Any]]:
    with bare_server() as bare:
        rooms = [f"!bare{i}:localhost" for i in range(args.rooms)]
        readers = [Poll(f"room:{room}", "0", True) for room in rooms]
        return await _rates(
            bare.url, [(bare.url, room, "sender") for room in rooms], readers, {"bare": bare.pid}, args
        )


def figures(result: dict[str, Any]) -> list[Figure]:
    """Per rate, each beside the bare server's: the achieved rate, send 200 -> seen and send start
    -> seen (p50, p99), and the CPU-seconds per 1,000 events of every worker together (each
    worker's own are in the JSON result and the progress lines)."""
    found = []
    for ours, bare in zip(result["fanout"], result["ceiling"], strict=True):
        label = ours["rate"] if ours["offered_per_s"] is None else f"{ours['offered_per_s']:,.0f}/s offered"
        found.append(
            Figure(
                "live", f"events/s achieved, {label}", ours["achieved_per_s"], "/s", bare["achieved_per_s"]
            )
        )
        for key, what in (("seen_after_200", "send 200 -> seen"), ("seen_after_start", "send start -> seen")):
            for q in ("p50", "p99"):
                value, ceiling = ours[key][f"{q}_ms"], bare[key][f"{q}_ms"]
                target, met, ceiling_met = "", None, None
                if key == "seen_after_200" and q == "p99":
                    target = f"<= {TARGET_SEEN_P99_MS:.0f} ms"
                    met = value <= TARGET_SEEN_P99_MS and not ours["missing"]
                    ceiling_met = ceiling <= TARGET_SEEN_P99_MS
                found.append(
                    Figure(
                        "live", f"{what} {q}, {label}", value, "ms", ceiling, target, met,
                        ceiling_met=ceiling_met,
                    )
                )  # fmt: skip
        cpu, bare_cpu = ours["cpu_s_per_1000"]["all"], bare["cpu_s_per_1000"]["all"]
        limit = TARGET_CPU_SATURATED if ours["offered_per_s"] is None else None
        if ours["offered_per_s"] == 10:
            limit = TARGET_CPU_AT_10
        found.append(
            Figure(
                "live", f"CPU-s per 1,000 events, every worker, {label}",
                cpu if cpu is not None else float("nan"), "CPU-s", bare_cpu,
                "" if limit is None else f"<= {limit:g}",
                None if limit is None else cpu is not None and cpu <= limit,
                ceiling_met=None if limit is None or bare_cpu is None else bare_cpu <= limit,
            )
        )  # fmt: skip
    return found


def _rate_list(text: str) -> list[float | None]:
    """`--rates`: positive events/s or `max`, comma-separated."""
    rates: list[float | None] = []
    for part in text.split(","):
        try:
            rate = None if part == "max" else float(part)
        except ValueError:
            rate = -1.0
        if rate is not None and not rate > 0:
            raise argparse.ArgumentTypeError(f"not a rate: {part!r} (a positive number of events/s, or max)")
        rates.append(rate)
    return rates


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout bench live", description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", help="an admin URL (a benchmark database is created on it)")
    p.add_argument("--redis-url")
    p.add_argument(
        "--rates", type=_rate_list, default=[10.0, 50.0, 200.0, 1000.0, None],
        help="offered events/s in all, comma-separated; 'max': closed loop (default 10,50,200,1000,max)",
    )  # fmt: skip
    p.add_argument("--seconds", type=float, default=10.0, help="how long each rate runs")
    p.add_argument(
        "--min-events",
        type=int,
        default=MIN_EVENTS,
        help="an open-loop rate runs at least long enough for this many events",
    )
    p.add_argument("--rooms", type=positive_int, default=10, help="rooms of 2 (a sender and a reader)")
    p.add_argument("--sender-processes", type=positive_int, default=4)
    p.add_argument("--reader-processes", type=positive_int, default=2)
    p.add_argument("--closed-loop", type=positive_int, default=16, help="senders in flight at once for 'max'")
    p.add_argument(
        "--profile", metavar="DIR", help="profile each worker's CPU at each rate; summaries in DIR"
    )
    args = p.parse_args(argv)
    raise_fd_limit()
    return beside_ceiling(args, {"rooms": args.rooms, "seconds": args.seconds}, _ceiling, _fanout, figures)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
