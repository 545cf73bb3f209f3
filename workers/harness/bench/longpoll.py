"""`fanout bench longpoll`: one sync worker holding many idle `/sync` long-polls, then waking a room.

A sync worker holds `--polls` concurrent long-polls (default 10,000): `--room-members` users
(default 1,000) joined to one public room hold one poll each (its creator, who sends, one more),
and the rest come from a few users in no shared room (many polls per access token, as clients
with several tabs do). The polls time out after 60 s, longer than the idle window: nothing
answers them until the wake. Measured:

* memory: the worker's RSS before the polls and once all are held (VmRSS from /proc);
* idle CPU: the worker's CPU time (user + system) over `--idle-seconds` while every poll waits;
* wake: one message is sent into the room; for each member's poll, the time from the send's
  answer to the poll's response arriving (CLOCK_MONOTONIC, shared by the processes).

It is `fanout bench crowd` with one large room and no re-polls while idle (`crowd.measure`, its
client processes and its bare server as the ceiling: what waking that many of that many held
connections costs the client and the kernel, without fanout).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from workers.harness.bench import crowd
from workers.harness.bench._common import Figure, beside_ceiling
from workers.harness.bench.poll_clients import raise_fd_limit

POLL_TIMEOUT_S = 60.0
TARGET_RSS_MB = 300.0
TARGET_IDLE_CPU = 0.05
TARGET_WAKE_P99_MS = 100.0


def figures(result: dict[str, Any]) -> list[Figure]:
    """Memory and idle CPU against their bounds; the wake p99 beside the bare server's."""
    ours, ceiling = result["fanout"], result["ceiling"]
    polls = f"{ours['polls']:,} long-polls"
    return [
        Figure(
            "longpoll",
            f"sync worker RSS holding {polls}",
            ours["rss_held_mb"],
            "MB",
            ceiling["rss_held_mb"],
            f"< {TARGET_RSS_MB:.0f} MB",
            ours["rss_held_mb"] < TARGET_RSS_MB,
        ),
        Figure(
            "longpoll",
            f"sync worker idle CPU holding {polls}",
            ours["idle_cpu_fraction"] * 100,
            "% of a core",
            ceiling["idle_cpu_fraction"] * 100,
            f"< {TARGET_IDLE_CPU * 100:.0f} %",
            ours["idle_cpu_fraction"] < TARGET_IDLE_CPU,
        ),
        Figure(
            "longpoll",
            f"wake {ours['woken']:,} room members after one event, p99",
            ours["p99_ms"],
            "ms",
            ceiling["p99_ms"],
            f"<= {TARGET_WAKE_P99_MS:.0f} ms",
            ours["p99_ms"] <= TARGET_WAKE_P99_MS and ours["woken"] == result["room_members"],
        ),
    ]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout bench longpoll", description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", help="an admin URL (a benchmark database is created on it)")
    p.add_argument("--redis-url")
    p.add_argument("--polls", type=int, default=10_000, help="concurrent long-polls on the sync worker")
    p.add_argument("--room-members", type=int, default=1_000, help="members of the room woken by one event")
    p.add_argument(
        "--polls-per-idle-user", type=int, default=100, help="polls per access token not in the room"
    )
    p.add_argument("--open-per-s", type=float, default=2000.0, help="polls opened per second")
    p.add_argument("--client-processes", type=int, default=4)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--profile", metavar="DIR", help="profile the sync worker's CPU: idle window, wake")
    args = p.parse_args(argv)
    if args.room_members + 1 > args.polls:
        p.error("--room-members must be below --polls")
    if args.idle_seconds >= POLL_TIMEOUT_S:
        p.error(f"--idle-seconds must be below the polls' timeout ({POLL_TIMEOUT_S:g} s)")
    fds = raise_fd_limit()
    if fds < args.polls + 1024:
        p.error(f"the file-descriptor hard limit is {fds}: too low for {args.polls} polls")
    args.rooms, args.members, args.poll_timeout = 1, args.room_members + 1, POLL_TIMEOUT_S
    args.rounds, args.round_gap = 1, 0.0
    return beside_ceiling(args, {"room_members": args.room_members}, crowd.ceiling, crowd.fanout, figures)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
