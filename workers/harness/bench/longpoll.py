"""`fanout bench longpoll`: one sync worker holding many idle `/sync` long-polls, then waking a room.

A sync worker holds `--polls` concurrent long-polls (default 10,000): `--room-members` users
(default 1,000) joined to one public room hold one poll each, and the rest come from a few users
in no shared room (many polls per access token, as clients with several tabs do). Measured:

* memory: the worker's RSS before the polls and once all are held (VmRSS from /proc);
* idle CPU: the worker's CPU time (user + system) over `--idle-seconds` while every poll waits;
* wake: one message is sent into the room; for each member's poll, the time from the send's
  answer to the poll's response arriving (CLOCK_MONOTONIC, shared by the processes).

The ceiling: the same client processes against a bare aiohttp server (its own process, same
event loop) that holds the same number of polls on an asyncio.Event and answers them all when
told (only the members' polls): what waking that many of that many held connections costs the
client and the kernel, without fanout.

Clients are `--client-processes` processes (default 4), each holding its share of the polls, so
the client is not what limits the wake. The file-descriptor limit of this process (and so of the
workers it starts) is raised to its hard limit here, never in a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from workers import event_loop
from workers.harness.bench._common import Figure, percentile, process_usage, progress, scratch_database
from workers.harness.bench.profile import profile
from workers.harness.cluster import LocalCluster
from workers.services import free_port, given_or_embedded

CLIENT = "/_matrix/client/v3"
POLL_TIMEOUT_MS = 60_000
TARGET_RSS_MB = 300.0
TARGET_IDLE_CPU = 0.05
TARGET_WAKE_P99_MS = 100.0

#: One poll: (access token, since token or "", whether its user is a member of the room).
Poll = tuple[str, str, bool]


def _raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# -- the client processes -------------------------------------------------------------------------


async def _hold(url: str, polls: list[Poll], conn: Connection) -> None:
    """Open every poll, say so, then report the arrival time of each member's response."""
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=POLL_TIMEOUT_MS / 1000 + 30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def poll(token: str, since: str) -> float:
            query = f"timeout={POLL_TIMEOUT_MS}" + (f"&since={quote(since)}" if since else "")
            headers = {"Authorization": f"Bearer {token}"}
            async with http.get(f"{url}?{query}", headers=headers) as resp:
                await resp.read()
                arrived = time.monotonic()
                if resp.status != 200:
                    raise RuntimeError(f"poll answered {resp.status}")
            return arrived

        tasks = [(member, asyncio.create_task(poll(token, since))) for token, since, member in polls]
        await asyncio.sleep(0.5)  # let every request leave before saying so
        conn.send("held")
        members = [task for member, task in tasks if member]
        arrivals = await asyncio.gather(*members, return_exceptions=True)
        conn.send([a for a in arrivals if isinstance(a, float)])
        # Closing the other polls while another client process still waits for its members would
        # put thousands of connection closes inside the wake being measured.
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        for _, task in tasks:
            task.cancel()
        await asyncio.gather(*(task for _, task in tasks), return_exceptions=True)


def _client_main(url: str, polls: list[Poll], conn: Connection) -> None:
    _raise_fd_limit()
    event_loop.run(_hold(url, polls, conn))


class _Clients:
    """`n` client processes sharing the polls; `held()` once all are open, `arrivals()` after."""

    def __init__(self, url: str, polls: list[Poll], n: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.processes = []
        for i in range(n):
            ours, theirs = ctx.Pipe()
            process = ctx.Process(target=_client_main, args=(url, polls[i::n], theirs), daemon=True)
            process.start()
            self.pipes.append(ours)
            self.processes.append(process)

    def held(self) -> None:
        for pipe in self.pipes:
            if not pipe.poll(300) or pipe.recv() != "held":
                raise RuntimeError("a client process did not open its polls")

    def arrivals(self, limit_s: float) -> list[float]:
        """Every member's arrival time; then the client processes may close their other polls."""
        found: list[float] = []
        for pipe in self.pipes:
            if pipe.poll(limit_s):
                found += pipe.recv()
        for pipe in self.pipes:
            with contextlib.suppress(OSError):  # a client process that died has nothing to close
                pipe.send("close")
        return found

    def close(self) -> None:
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()


# -- the ceiling: a bare server holding the same polls ----------------------------------------------


def _bare_app() -> web.Application:
    wake = asyncio.Event()
    never = asyncio.Event()
    held = [0]

    async def sync(request: web.Request) -> web.Response:
        # Only the room members' polls wake, as in fanout; the others stay held.
        held[0] += 1
        await (wake if request.query.get("since") == "member" else never).wait()
        return web.json_response({"next_batch": "s1"})

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"held": held[0]})

    async def do_wake(request: web.Request) -> web.Response:
        wake.set()
        return web.json_response({})

    app = web.Application()
    app.router.add_get(CLIENT + "/sync", sync)
    app.router.add_post("/wake", do_wake)
    app.router.add_get("/held", count)
    return app


def _serve_bare(port: int) -> int:
    _raise_fd_limit()

    async def serve() -> None:
        runner = web.AppRunner(_bare_app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    event_loop.run(serve())
    return 0


def _wake_ms(arrivals: list[float], sent: float) -> dict[str, float]:
    ms = [(a - sent) * 1000 for a in arrivals]
    return {
        "woken": len(ms),
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms, default=float("nan")), 2),
    }


def _ceiling(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "workers.harness.bench.longpoll", "--bare", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        polls = [
            ("t", "member" if i < args.room_members else "idle", i < args.room_members)
            for i in range(args.polls)
        ]
        clients = _Clients(url + CLIENT + "/sync", polls, args.client_processes)
        try:
            clients.held()
            for _ in range(240):  # up to 2 minutes for every poll to reach the server
                with urllib.request.urlopen(f"{url}/held", timeout=10) as answer:
                    if json.load(answer)["held"] >= args.polls:
                        break
                time.sleep(0.5)
            rss, _ = process_usage(server.pid)
            sent = time.monotonic()
            urllib.request.urlopen(urllib.request.Request(f"{url}/wake", method="POST"), timeout=10).close()
            result = _wake_ms(clients.arrivals(60), sent)
            result["held_rss_mb"] = round(rss, 1)
            return result
        finally:
            clients.close()
    finally:
        server.terminate()
        server.wait()


# -- fanout ------------------------------------------------------------------------------------------


async def _register(http: aiohttp.ClientSession, base: str, name: str) -> str:
    body = {"username": name, "password": uuid.uuid4().hex, "auth": {"type": "m.login.dummy"}}
    async with http.post(f"{base}{CLIENT}/register", json=body) as resp:
        resp.raise_for_status()
        return str((await resp.json())["access_token"])


async def _setup(base: str, args: argparse.Namespace) -> tuple[str, str, list[Poll]]:
    """Members joined to one room, a few idle users; one since token per user. Returns the
    creator's token, the room id and the polls."""
    tag = uuid.uuid4().hex[:6]
    idle_users = max(1, (args.polls - args.room_members) // args.polls_per_idle_user)
    limit = asyncio.Semaphore(32)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
        creator = await _register(http, base, f"creator{tag}")
        headers = {"Authorization": f"Bearer {creator}"}
        async with http.post(
            f"{base}{CLIENT}/createRoom", json={"preset": "public_chat"}, headers=headers
        ) as r:
            r.raise_for_status()
            room = str((await r.json())["room_id"])

        async def user(name: str, join: bool) -> str:
            async with limit:
                token = await _register(http, base, name)
                if join:
                    auth = {"Authorization": f"Bearer {token}"}
                    async with http.post(
                        f"{base}{CLIENT}/join/{quote(room, safe='')}", json={}, headers=auth
                    ) as r:
                        r.raise_for_status()
                return token

        async def latest(token: str) -> tuple[str, str]:
            # Taken once every member has joined (each join was answered once this worker had it),
            # so no poll wakes for another member's join instead of the message.
            filtered = quote('{"room": {"timeline": {"limit": 0}}}')
            async with (
                limit,
                http.get(
                    f"{base}{CLIENT}/sync?timeout=0&filter={filtered}",
                    headers={"Authorization": f"Bearer {token}"},
                ) as r,
            ):
                r.raise_for_status()
                return token, str((await r.json())["next_batch"])

        progress(f"  registering {args.room_members} members and {idle_users} idle users ...")
        member_tokens = await asyncio.gather(*(user(f"m{i}{tag}", True) for i in range(args.room_members)))
        idle_tokens = await asyncio.gather(*(user(f"i{i}{tag}", False) for i in range(idle_users)))
        members = await asyncio.gather(*(latest(t) for t in member_tokens))
        idle = await asyncio.gather(*(latest(t) for t in idle_tokens))
    polls: list[Poll] = [(token, since, True) for token, since in members]
    while len(polls) < args.polls:
        token, since = idle[len(polls) % len(idle)]
        polls.append((token, since, False))
    return creator, room, polls


async def _waiting(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(f"{base}/health"):
        pass
    async with http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return next(
        (float(line.split()[-1]) for line in text.splitlines() if line.startswith("fanout_sync_waiting ")), 0
    )


async def _fanout(args: argparse.Namespace, admin_url: str, redis_url: str) -> dict[str, Any]:
    database_url = await scratch_database(admin_url, "longpoll")
    workdir = Path(tempfile.mkdtemp(prefix="fanout-bench-longpoll-"))
    cluster = LocalCluster(
        database_url,
        redis_url,
        workdir,
        persisters=1,
        sync_workers=1,
        background_workers=0,
        channel_prefix=f"bench-{uuid.uuid4().hex[:6]}",
    )
    await cluster.start()
    try:
        base = cluster.url("sync1")
        creator, room, polls = await _setup(base, args)
        sync_pid = cluster.workers["sync1"].process.pid  # type: ignore[union-attr]
        rss_before, _ = process_usage(sync_pid)
        progress(f"  opening {len(polls):,} polls from {args.client_processes} client processes ...")
        clients = _Clients(base + CLIENT + "/sync", polls, args.client_processes)
        try:
            clients.held()
            async with aiohttp.ClientSession() as http:
                for _ in range(240):  # up to 2 minutes for every poll to reach the worker
                    held = await _waiting(http, base)
                    if held >= len(polls):
                        break
                    await asyncio.sleep(0.5)
                rss_held, cpu_start = process_usage(sync_pid)
                progress(f"  {held:,.0f} polls held; idle for {args.idle_seconds} s ...")
                await asyncio.sleep(args.idle_seconds)
                _, cpu_end = process_usage(sync_pid)
                profiles = None
                if args.profile is not None:  # the wake only: a few seconds from just before the send
                    profiles = profile({"sync1": sync_pid}, 3, Path(args.profile) / "wake")
                    await asyncio.sleep(0.3)
                path = f"{CLIENT}/rooms/{quote(room, safe='')}/send/m.room.message/wake{uuid.uuid4().hex}"
                headers = {"Authorization": f"Bearer {creator}"}
                async with http.put(
                    f"{base}{path}", json={"msgtype": "m.text", "body": "wake"}, headers=headers
                ) as r:
                    r.raise_for_status()
                    sent = time.monotonic()
            wake = _wake_ms(clients.arrivals(60), sent)
            for path_written in profiles.wait() if profiles is not None else []:
                progress(f"  profile: {path_written}")
        finally:
            clients.close()
    finally:
        await cluster.stop()
    return {
        "polls": len(polls),
        "held": held,
        "rss_before_mb": round(rss_before, 1),
        "rss_held_mb": round(rss_held, 1),
        "idle_cpu_fraction": round((cpu_end - cpu_start) / args.idle_seconds, 4),
        **wake,
    }


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
            None,
            f"< {TARGET_RSS_MB:.0f} MB",
            ours["rss_held_mb"] < TARGET_RSS_MB,
        ),
        Figure(
            "longpoll",
            f"sync worker idle CPU holding {polls}",
            ours["idle_cpu_fraction"] * 100,
            "% of a core",
            None,
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
    if argv[:1] == ["--bare"]:
        return _serve_bare(int(argv[1]))
    p = argparse.ArgumentParser(prog="fanout bench longpoll", description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", help="an admin URL (a benchmark database is created on it)")
    p.add_argument("--redis-url")
    p.add_argument("--polls", type=int, default=10_000, help="concurrent long-polls on the sync worker")
    p.add_argument("--room-members", type=int, default=1_000, help="members of the room woken by one event")
    p.add_argument(
        "--polls-per-idle-user", type=int, default=100, help="polls per access token not in the room"
    )
    p.add_argument("--client-processes", type=int, default=4)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--profile", metavar="DIR", help="record the sync worker with py-spy during the wake")
    args = p.parse_args(argv)
    if args.room_members > args.polls:
        p.error("--room-members cannot exceed --polls")
    fds = _raise_fd_limit()
    if fds < args.polls + 1024:
        p.error(f"the file-descriptor hard limit is {fds}: too low for {args.polls} polls")
    progress(f"ceiling: a bare server holding {args.polls:,} polls, woken at once")
    result: dict[str, Any] = {"room_members": args.room_members, "ceiling": _ceiling(args)}
    progress(f"fanout: one sync worker holding {args.polls:,} polls")
    with given_or_embedded(args.database_url, args.redis_url) as (admin_url, redis_url):
        result["fanout"] = event_loop.run(_fanout(args, admin_url, redis_url))
    print(json.dumps(result, indent=2))
    for figure in figures(result):
        progress(f"{figure.name}: {figure.value:,.2f} {figure.unit} (target {figure.target}: {figure.met})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
