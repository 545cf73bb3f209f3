"""`fanout bench crowd`: one sync worker holding a crowd of re-issued long-polls, woken room by room.

`--rooms` rooms (default 100) of `--members` users (default 10): each room's creator sends, the
others read. Every member holds one `/sync` long-poll; the rest of the `--polls` (default 10,000)
come from users in no room, `--polls-per-idle-user` each (clients with several devices or tabs).
Every poll has a timeout of `--poll-timeout` seconds (default 30) and is re-issued with its
`next_batch` as soon as it returns. The polls are opened at `--open-per-s` a second (default
500) from `--client-processes` processes (`poll_clients.py`). Measured on the sync worker's
process (/proc):

* RSS once every poll is held, and its maximum over the run;
* idle CPU per re-poll: the worker's CPU time over `--idle-seconds` (default 30: each poll times
  out and is re-issued about once in a window as long as the poll timeout) divided by the
  answers the clients received in that window;
* the wake, `--rounds` times (default 3): one event into every room at once (sent straight to
  the persister); for each reader's poll, the time from that send's 200 to the poll's answer
  arriving. Woken counts the readers' answers that brought their round's event (expected:
  rooms x (members - 1) per round; the senders' own polls wake too, not counted). CPU per reader
  woken: the worker's CPU time from each round's sends until its last reader answered (polling
  every 0.2 s), over the readers woken: on a loaded machine the figure to compare, where the
  wake's latency measures the machine.

The clients' own load, so that a reader can tell they are not what bounds the wake: each client
process reports its CPU time (user + system). Client CPU per answer in the idle window and per
reader woken (every process's CPU over the answers), and the busiest client process's share of one
core: over the idle window, and over each round from its sends to its last reader's answer (the
CPU read up to 0.2 s later, so the share is an upper bound). A share well below 1 says that
process was waiting for the server, not the server for it; the clients' total, in cores, reads
beside the machine's core count (the server shares those cores).

The ceiling: the same client processes and sends against the bare server of `bare_sync.py`
holding the same polls: what holding, re-polling and waking that many polls costs without
fanout. It runs on aiohttp (fanout's server: the ceiling column), and, before it, on each of
`--bare-servers` (default uvicorn with httptools, and granian; `bare_asgi.py`) that is installed
(the `bench` extra): each such row reads beside the bare aiohttp server, so its ratio is how much
of aiohttp's own per-request cost that server would leave.

The command raises its file-descriptor limit to the hard limit (the clients and the workers it
starts inherit it) and refuses to run when that is too low for the polls.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from workers.harness.bench._common import (
    Figure,
    bench_cluster,
    beside_ceiling,
    latency_ms,
    positive_int,
    process_usage,
    progress,
)
from workers.harness.bench.bare_server import SERVERS, bare_server, installed
from workers.harness.bench.poll_clients import (
    ClientUsage,
    Poll,
    PollClients,
    raise_fd_limit,
    send_marked,
    wait_held,
)
from workers.harness.bench.profile import Profiles, recorder, sampled_dir
from workers.harness.bench.room_setup import populate

TARGET_RSS_MB = 300.0
#: A re-poll's CPU against the bare aiohttp server's in the same run (0.15 ms, the target before,
#: is below what aiohttp alone costs per response on the machines measured).
TARGET_REPOLL_RATIO = 1.3
TARGET_WAKE_P99_MS = 100.0
#: How long a round waits for every reader before it counts the missing ones as not woken.
ROUND_LIMIT_S = 15.0
#: A client process busier than this share of one core during a wake may be what bounds it.
CLIENT_SATURATED = 0.9

#: A room as the measurement sees it: (room id, the sender's access token).
Target = tuple[str, str]


async def measure(
    sync_base: str,
    send_base: str,
    pid: int,
    rooms: list[Target],
    polls: list[Poll],
    args: argparse.Namespace,
    record: Callable[[str], Profiles] | None = None,
) -> dict[str, Any]:
    """Open `polls` against `sync_base`, measure the process `pid` while they idle, then wake every
    room `args.rounds` times (sends to `send_base`). The same for fanout and the bare server.
    With `record` (a phase name -> a started recording of `pid`), its CPU is profiled over the
    idle window and over the first round."""
    readers = sum(p.measured for p in polls)
    rss_before, _ = process_usage(pid)
    progress(
        f"  opening {len(polls):,} polls at {args.open_per_s:,.0f}/s from {args.client_processes} processes"
    )
    clients = PollClients(
        sync_base + "/_matrix/client/v3/sync",
        polls,
        args.client_processes,
        timeout_ms=int(args.poll_timeout * 1000),
        open_per_s=args.open_per_s,
    )
    try:
        await clients.opened()
        held = await wait_held(sync_base, len(polls))
        rss_held, cpu_start = process_usage(pid)
        idle_start = await clients.usage()
        started = time.monotonic()
        progress(f"  {held:,.0f} polls held; idle for {args.idle_seconds:g} s")
        recording = None if record is None else record("idle")
        await asyncio.sleep(args.idle_seconds)
        rss_idle, cpu_end = process_usage(pid)
        idle_end = await clients.usage()
        idle_s = time.monotonic() - started
        profiles = [] if recording is None else recording.wait()  # after the window: it writes
        idle = ClientLoad.between(idle_start, idle_end, idle_s)
        idle_answers = idle.answers
        answered: dict[tuple[int, int], float] = {}
        seen = []
        wake_cpu = 0.0
        wakes: list[ClientLoad] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            for round_ in range(args.rounds):
                recording = None if record is None or round_ else record("wake")
                round_cpu = process_usage(pid)[1]
                round_clients = await clients.usage()
                round_start = time.monotonic()
                sends = await asyncio.gather(
                    *(
                        send_marked(http, send_base, room, token, f"{round_}:{i}")
                        for i, (room, token) in enumerate(rooms)
                    )
                )
                if not all(ok for _, _, ok in sends):
                    raise RuntimeError(f"round {round_}: a send failed")
                answered |= {(round_, i): end for i, (_, end, _) in enumerate(sends)}
                deadline = time.monotonic() + ROUND_LIMIT_S
                while True:
                    seen += await clients.seen()
                    woken = sum(1 for text, _, _ in seen if text.startswith(f"{round_}:"))
                    if woken >= readers or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.2)
                wake_cpu += process_usage(pid)[1] - round_cpu
                last = max((at for text, at, _ in seen if text.startswith(f"{round_}:")), default=round_start)
                wakes.append(ClientLoad.between(round_clients, await clients.usage(), last - round_start))
                if recording is not None:
                    profiles += recording.wait()
                progress(f"  round {round_ + 1}: {woken:,} of {readers:,} readers woken")
                await asyncio.sleep(args.round_gap)
        rss_end, _ = process_usage(pid)
        _, failed = await clients.answers()
    finally:
        clients.close()
    for written in profiles:
        progress(f"  profile: {written}")
    woken_ms: dict[tuple[str, int], float] = {}
    for text, arrived, poll in seen:
        round_text, _, room_text = text.partition(":")
        sent_at = answered[(int(round_text), int(room_text))]
        woken_ms.setdefault((round_text, poll), (arrived - sent_at) * 1000)
    return {
        "polls": len(polls),
        "held": held,
        "rss_before_mb": round(rss_before, 1),
        "rss_held_mb": round(rss_held, 1),
        "rss_max_mb": round(max(rss_held, rss_idle, rss_end), 1),
        "idle_seconds": round(idle_s, 1),
        "idle_answers": idle_answers,
        "idle_cpu_fraction": round((cpu_end - cpu_start) / idle_s, 4),
        "repoll_cpu_ms": round((cpu_end - cpu_start) / idle_answers * 1000, 4) if idle_answers else math.nan,
        "failed_requests": failed,
        "rounds": args.rounds,
        "expected_woken": readers * args.rounds,
        "woken": len(woken_ms),
        "wake_cpu_ms": round(wake_cpu / len(woken_ms) * 1000, 4) if woken_ms else math.nan,
        "client_processes": len(idle_start),
        "cores": os.cpu_count(),
        "client_idle_cpu_ms": _per(idle.cpu_s, idle.answers),
        "client_idle_busiest_share": round(idle.busiest, 3),
        "client_idle_cores": round(idle.cpu_s / idle_s, 3),
        "client_wake_cpu_ms": _per(sum(w.cpu_s for w in wakes), len(woken_ms)),
        "client_wake_busiest_share": round(max((w.busiest for w in wakes), default=math.nan), 3),
        "client_wake_cores": round(max((w.cores for w in wakes), default=math.nan), 3),
        **{k: v for k, v in latency_ms(list(woken_ms.values())).items() if k != "samples"},
    }


@dataclass(frozen=True)
class ClientLoad:
    """The client processes over one stretch of a run: the answers they received, their CPU
    seconds, the busiest process's CPU as a share of one core, and all of them in cores."""

    answers: int
    cpu_s: float
    busiest: float
    cores: float

    @staticmethod
    def between(before: list[ClientUsage], after: list[ClientUsage], wall_s: float) -> ClientLoad:
        cpu = [b.cpu_s - a.cpu_s for a, b in zip(before, after, strict=True)]
        wall = max(wall_s, 1e-3)
        return ClientLoad(
            sum(b.answers - a.answers for a, b in zip(before, after, strict=True)),
            sum(cpu),
            max(cpu, default=0.0) / wall,
            sum(cpu) / wall,
        )


def _per(cpu_s: float, count: int) -> float:
    """CPU milliseconds per item (NaN for none)."""
    return round(cpu_s / count * 1000, 4) if count else math.nan


#: A user's poll as the crowd is made of them: (access token, since token).
Holder = tuple[str, str]


def _polls(rooms: list[list[Holder]], idle: list[Holder], total: int) -> list[Poll]:
    """One poll per room member (the first, the sender, not measured), then the idle users' polls
    round-robin up to `total`."""
    polls = [Poll(token, since, i > 0) for members in rooms for i, (token, since) in enumerate(members)]
    polls += [Poll(*idle[n % len(idle)]) for n in range(total - len(polls))]
    return polls


async def fanout(args: argparse.Namespace, admin_url: str, redis_url: str) -> dict[str, Any]:
    async with bench_cluster(
        admin_url, redis_url, "crowd", persisters=1, sync_workers=1, cpu_profile=sampled_dir(args.profile)
    ) as cluster:
        base = cluster.url("sync1")
        rooms, idle = await populate(base, args.rooms, args.members, idle_users(args))
        members = [[(u.token, u.since) for u in (r.sender, *r.joined)] for r in rooms]
        polls = _polls(members, [(u.token, u.since) for u in idle], args.polls)
        pid = cluster.workers["sync1"].process.pid  # type: ignore[union-attr]
        targets = [(r.room_id, r.sender.token) for r in rooms]
        record = recorder(cluster, ["sync1"])
        return await measure(base, cluster.url("persister1"), pid, targets, polls, args, record)


async def ceiling(args: argparse.Namespace, server: str = "aiohttp") -> dict[str, Any]:
    with bare_server(server) as bare:
        rooms = [f"!bare{i}:localhost" for i in range(args.rooms)]
        members = [[(f"room:{room}", "0")] * args.members for room in rooms]
        polls = _polls(members, [("idle", "0")], args.polls)
        measured = await measure(bare.url, bare.url, bare.pid, [(r, "sender") for r in rooms], polls, args)
        return {"server": server, **measured}


def other_ceilings(args: argparse.Namespace) -> dict[str, Any]:
    """The bare server on each of `--bare-servers` that is installed, by `ceiling_<server>`; a
    line says which are not (and are left out)."""
    from workers.process import event_loop

    found = {}
    for server in args.bare_servers:
        if not installed(server):
            progress(f"{SERVERS[server]}: not installed (pip install 'fanout[bench]'); left out")
            continue
        progress(f"ceiling: the same clients against the {SERVERS[server]} server")
        found[f"ceiling_{server}"] = event_loop.run(ceiling(args, server))
    return found


def idle_users(args: argparse.Namespace) -> int:
    idle_polls: int = args.polls - args.rooms * args.members
    per_user: int = args.polls_per_idle_user
    return math.ceil(idle_polls / per_user)


def figures(result: dict[str, Any]) -> list[Figure]:
    """RSS, CPU per re-poll, woken and the wake's p50, p99 and max, each beside the bare server's."""
    ours, bare = result["fanout"], result["ceiling"]
    polls = f"{ours['polls']:,} polls"
    return [
        Figure(
            "crowd", f"sync worker RSS holding {polls}", ours["rss_max_mb"], "MB", bare["rss_max_mb"],
            f"< {TARGET_RSS_MB:.0f} MB", ours["rss_max_mb"] < TARGET_RSS_MB,
            ceiling_met=bare["rss_max_mb"] < TARGET_RSS_MB,
        ),
        Figure(
            "crowd", f"CPU per re-poll, {polls} idle", ours["repoll_cpu_ms"], "ms", bare["repoll_cpu_ms"],
            f"ratio <= {TARGET_REPOLL_RATIO}",
            ours["repoll_cpu_ms"] <= TARGET_REPOLL_RATIO * bare["repoll_cpu_ms"],
        ),
        Figure(
            "crowd", f"readers woken ({ours['rounds']} rounds, every room at once)", ours["woken"], "",
            bare["woken"], f"= {ours['expected_woken']:,}", ours["woken"] == ours["expected_woken"],
        ),
        Figure(
            "crowd", "CPU per reader woken (its answer, its re-issued poll, the sends' rows)",
            ours["wake_cpu_ms"], "ms", bare["wake_cpu_ms"],
        ),
        Figure("crowd", "send 200 -> wake, p50", ours["p50_ms"], "ms", bare["p50_ms"]),
        Figure(
            "crowd", "send 200 -> wake, p99", ours["p99_ms"], "ms", bare["p99_ms"],
            f"<= {TARGET_WAKE_P99_MS:.0f} ms", ours["p99_ms"] <= TARGET_WAKE_P99_MS,
            ceiling_met=bare["p99_ms"] <= TARGET_WAKE_P99_MS,
        ),
        Figure("crowd", "send 200 -> wake, max", ours["max_ms"], "ms", bare["max_ms"]),
        *client_figures(ours, bare),
        *(figure for server in SERVERS if f"ceiling_{server}" in result
          for figure in server_floor(result[f"ceiling_{server}"], bare)),
    ]  # fmt: skip


def client_figures(ours: dict[str, Any], bare: dict[str, Any]) -> list[Figure]:
    """The client processes' own CPU, in fanout's run beside the bare server's: per answer, and how
    close the busiest came to a full core during a wake (the sign of clients bounding it)."""
    processes = f"{ours['client_processes']} client processes"
    busiest = ours["client_wake_busiest_share"]
    return [
        Figure("crowd", f"{processes}: CPU per answer, idle", ours["client_idle_cpu_ms"], "ms",
               bare["client_idle_cpu_ms"]),
        Figure("crowd", f"{processes}: CPU per reader woken", ours["client_wake_cpu_ms"], "ms",
               bare["client_wake_cpu_ms"]),
        Figure("crowd", f"{processes}: busiest one during a wake, share of a core", busiest, "",
               bare["client_wake_busiest_share"], f"< {CLIENT_SATURATED}", busiest < CLIENT_SATURATED),
        Figure("crowd", f"{processes}: all during a wake, cores (of {ours['cores']})",
               ours["client_wake_cores"], "", bare["client_wake_cores"]),
    ]  # fmt: skip


def server_floor(other: dict[str, Any], aiohttp: dict[str, Any]) -> list[Figure]:
    """The bare server on another HTTP server, each figure beside the bare aiohttp server's."""
    label = f"{SERVERS[other['server']]} vs bare aiohttp"
    return [
        Figure("crowd", f"{label}: RSS holding {other['polls']:,} polls", other["rss_max_mb"], "MB",
               aiohttp["rss_max_mb"]),
        Figure("crowd", f"{label}: CPU per re-poll", other["repoll_cpu_ms"], "ms", aiohttp["repoll_cpu_ms"]),
        Figure("crowd", f"{label}: CPU per reader woken", other["wake_cpu_ms"], "ms", aiohttp["wake_cpu_ms"]),
        Figure("crowd", f"{label}: readers woken", other["woken"], "", aiohttp["woken"],
               f"= {other['expected_woken']:,}", other["woken"] == other["expected_woken"]),
        Figure("crowd", f"{label}: send 200 -> wake, p50", other["p50_ms"], "ms", aiohttp["p50_ms"]),
        Figure("crowd", f"{label}: send 200 -> wake, p99", other["p99_ms"], "ms", aiohttp["p99_ms"]),
    ]  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout bench crowd", description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", help="an admin URL (a benchmark database is created on it)")
    p.add_argument("--redis-url")
    p.add_argument("--polls", type=positive_int, default=10_000, help="long-polls held on the sync worker")
    p.add_argument("--rooms", type=positive_int, default=100)
    p.add_argument(
        "--members", type=positive_int, default=10, help="users per room (one sender, the rest read)"
    )
    p.add_argument("--polls-per-idle-user", type=positive_int, default=100, help="polls per user in no room")
    p.add_argument("--open-per-s", type=float, default=500.0, help="polls opened per second")
    p.add_argument("--poll-timeout", type=float, default=30.0, help="each poll's timeout, seconds")
    p.add_argument("--idle-seconds", type=float, default=30.0, help="the idle window measured")
    p.add_argument("--rounds", type=positive_int, default=3, help="wakes of every room at once")
    p.add_argument("--round-gap", type=float, default=3.0, help="seconds between rounds")
    p.add_argument(
        "--client-processes",
        type=positive_int,
        default=max(4, os.cpu_count() or 1),
        help="processes the polls are spread over (default: 4 or the core count, if more)",
    )
    p.add_argument(
        "--bare-servers",
        type=_bare_servers,
        default=["uvicorn", "granian"],
        help="other HTTP servers to run the bare server on too, comma-separated ('' for none)",
    )
    p.add_argument("--profile", metavar="DIR", help="profile the sync worker's CPU: idle window, first wake")
    args = p.parse_args(argv)
    if args.members < 2:
        p.error("--members must be at least 2 (a sender and a reader)")
    if args.rooms * args.members > args.polls:
        p.error(f"--polls must be at least --rooms x --members ({args.rooms * args.members})")
    fds = raise_fd_limit()
    if fds < args.polls + 1024:
        p.error(f"the file-descriptor hard limit is {fds}: too low for {args.polls:,} polls")
    return beside_ceiling(args, other_ceilings(args), ceiling, fanout, figures)


def _bare_servers(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - (SERVERS.keys() - {"aiohttp"}))
    if unknown:
        raise argparse.ArgumentTypeError(f"not another bare server: {', '.join(unknown)}")
    return names


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
