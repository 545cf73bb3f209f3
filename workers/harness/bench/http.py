"""`fanout bench http`: Matrix sends over HTTP, driven by wrk, beside a bare aiohttp handler.

The load comes from wrk (C, epoll; Debian's `wrk`, installed by `make bench`), never from Python,
so the figure is the server's: `PUT /_matrix/client/v3/rooms/{room}/send/m.room.message/{txnId}`
with a unique txnId per request (`send.lua`), `--connections` open connections, for `--seconds`.

* ceiling: the same wrk run against a bare aiohttp handler in its own process, on the same event
  loop as the workers, doing what every send costs before the persister's work: look the access
  token's SHA-256 up, parse the JSON body strictly, answer a fixed event id. Also what wrk itself
  reaches, so the load generator is shown not to be the limit.
* direct: each persister receives the sends of the rooms it owns (one wrk per persister, at once),
  with 1 and 2 persisters; a sync worker and a background worker run beside them.
* forwarded: the same load sent to a sync worker, which forwards each send to the room's persister
  (what a client that knows nothing of our routing does).

Every run starts on a fresh database. Prints one JSON document on stdout and a table on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
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
from urllib.parse import quote

import aiohttp
import pydantic_core
from aiohttp import web

from workers.embedded.services import free_port, given_or_embedded
from workers.harness.bench._common import Figure, process_usage, progress, scratch_database
from workers.harness.bench.profile import Profiles, recorder, sampled_dir
from workers.harness.cluster import LocalCluster
from workers.process import event_loop
from workers.routing import writer_for_room

SCRIPT = Path(__file__).with_name("send.lua")
CLIENT = "/_matrix/client/v3"
TARGET_VS_CEILING = 0.5


def _bare_app(token: str) -> web.Application:
    tokens = {hashlib.sha256(token.encode()).hexdigest(): "@bench:localhost"}
    answer = pydantic_core.to_json({"event_id": "$bare"})

    async def send(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        user = tokens.get(hashlib.sha256(auth.removeprefix("Bearer ").encode()).hexdigest())
        if user is None:
            return web.json_response({"errcode": "M_UNKNOWN_TOKEN", "error": "unknown token"}, status=401)
        body = pydantic_core.from_json(await request.read(), allow_inf_nan=False)
        if not isinstance(body, dict):
            return web.json_response({"errcode": "M_BAD_JSON", "error": "not an object"}, status=400)
        return web.Response(body=answer, content_type="application/json")

    app = web.Application()
    app.router.add_put(CLIENT + "/rooms/{room}/send/{type}/{txn}", send)
    return app


def _serve_bare(port: int, token: str) -> int:
    async def serve() -> None:
        runner = web.AppRunner(_bare_app(token), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    event_loop.run(serve())
    return 0


def _wrk(url: str, token: str, paths: list[str], args: argparse.Namespace) -> subprocess.Popen[str]:
    env = {**os.environ, "FANOUT_TOKEN": token, "FANOUT_PATHS": ",".join(paths)}
    command = [
        "wrk",
        "-t",
        str(args.threads),
        "-c",
        str(args.connections),
        "-d",
        f"{args.seconds}s",
        "--latency",
        "-s",
        str(SCRIPT),
        url,
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wrk_result(process: subprocess.Popen[str]) -> dict[str, Any]:
    """Requests/s, error answers and latency percentiles from wrk's report."""
    out, _ = process.communicate()
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if process.returncode != 0 or rate is None:
        raise RuntimeError(f"wrk failed: {out.strip()[-500:]}")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    latency = {f"p{q}_ms": _ms(m.group(1)) for q in ("50", "99") if (m := re.search(rf"\s{q}%\s+(\S+)", out))}
    return {
        "requests_per_s": float(rate.group(1)),
        "non_2xx": int(bad.group(1)) if bad else 0,
        "socket_errors": errors.group(1).strip() if errors else "",
        **latency,
    }


def _ms(text: str) -> float:
    """wrk's latency text (`812.00us`, `3.20ms`, `1.05s`) in milliseconds."""
    number = re.match(r"[\d.]+", text)
    unit = text[number.end() :] if number else ""
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}.get(unit)
    return float(number.group()) * scale if number and scale else float("nan")


async def _setup_user_and_rooms(base: str, rooms: int) -> tuple[str, list[str]]:
    """A registered user (Matrix m.login.dummy) and `rooms` rooms it created."""
    async with aiohttp.ClientSession() as http:
        body = {
            "username": f"bench{uuid.uuid4().hex[:8]}",
            "password": uuid.uuid4().hex,
            "auth": {"type": "m.login.dummy"},
        }
        async with http.post(f"{base}{CLIENT}/register", json=body) as resp:
            resp.raise_for_status()
            token = str((await resp.json())["access_token"])
        headers = {"Authorization": f"Bearer {token}"}
        room_ids = []
        for _ in range(rooms):
            async with http.post(
                f"{base}{CLIENT}/createRoom", json={"preset": "public_chat"}, headers=headers
            ) as r:
                r.raise_for_status()
                room_ids.append(str((await r.json())["room_id"]))
    return token, room_ids


def _room_path(room_id: str) -> str:
    return f"{CLIENT}/rooms/{quote(room_id, safe='')}"


def _ceiling(args: argparse.Namespace) -> dict[str, Any]:
    progress("ceiling: wrk against a bare aiohttp handler (token lookup + JSON parse)")
    port, token = free_port(), uuid.uuid4().hex
    server = subprocess.Popen(
        [sys.executable, "-m", "workers.harness.bench.http", "--bare", str(port), token],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        paths = [_room_path(f"!bare{i}:localhost") for i in range(8)]
        return _wrk_result(_wrk(f"http://127.0.0.1:{port}", token, paths, args))
    finally:
        server.terminate()
        server.wait()


async def _cluster_run(
    args: argparse.Namespace, admin_url: str, redis_url: str, persisters: int
) -> dict[str, Any]:
    database_url = await scratch_database(admin_url, f"http{persisters}")
    workdir = Path(tempfile.mkdtemp(prefix="fanout-bench-http-"))
    cluster = LocalCluster(
        database_url,
        redis_url,
        workdir,
        persisters=persisters,
        sync_workers=1,
        background_workers=0,
        channel_prefix=f"bench-{uuid.uuid4().hex[:6]}",
        cpu_profile=sampled_dir(args.profile),
    )
    await cluster.start()
    try:
        token, rooms = await _setup_user_and_rooms(cluster.url("sync1"), args.rooms)
        writers = cluster.event_writers
        progress(f"  direct: {persisters} wrk run(s) at once, each on the rooms its persister owns")
        pids = cluster.pids
        profiles = _profile(cluster, f"{persisters}p-direct")
        cpu_before = sum(process_usage(pid)[1] for pid in pids.values())
        runs = [
            _wrk(
                cluster.url(w),
                token,
                [_room_path(r) for r in rooms if writer_for_room(r, writers) == w],
                args,
            )
            for w in writers
        ]
        direct = [_wrk_result(run) for run in runs]
        cpu = sum(process_usage(pid)[1] for pid in pids.values()) - cpu_before
        _report(profiles)
        progress("  forwarded: the same load sent to a sync worker")
        profiles = _profile(cluster, f"{persisters}p-forwarded")
        forwarded = _wrk_result(_wrk(cluster.url("sync1"), token, [_room_path(r) for r in rooms], args))
        _report(profiles)
    finally:
        await cluster.stop()
    sent = sum(d["requests_per_s"] for d in direct) * args.seconds
    return {
        "persisters": persisters,
        "direct_requests_per_s": round(sum(d["requests_per_s"] for d in direct), 1),
        "direct_cpu_s_per_1000": round(cpu / sent * 1000, 3) if sent else None,
        "direct_non_2xx": sum(d["non_2xx"] for d in direct),
        "direct": direct,
        "forwarded": forwarded,
    }


def _profile(cluster: LocalCluster, run: str) -> Profiles | None:
    record = recorder(cluster)
    return None if record is None else record(run)


def _report(profiles: Profiles | None) -> None:
    if profiles is not None:
        for path in profiles.wait():
            progress(f"  profile: {path}")


async def _run(args: argparse.Namespace, admin_url: str, redis_url: str) -> dict[str, Any]:
    result: dict[str, Any] = {
        "benchmark": "http",
        "seconds": args.seconds,
        "connections": args.connections,
        "threads": args.threads,
        "ceiling": _ceiling(args),
        "runs": [],
    }
    for persisters in (1, 2):
        progress(f"{persisters} persister(s)")
        result["runs"].append(await _cluster_run(args, admin_url, redis_url, persisters))
    return result


def figures(result: dict[str, Any]) -> list[Figure]:
    """Sends/s straight to the owners and through a sync worker, beside the bare handler."""
    ceiling = result["ceiling"]["requests_per_s"]
    found = [Figure("http", "bare handler (the ceiling wrk reaches)", ceiling, "req/s")]
    for run in result["runs"]:
        k = run["persisters"]
        direct = run["direct_requests_per_s"]
        found.append(
            Figure(
                "http",
                f"send to the owner, {k} persister(s)",
                direct,
                "req/s",
                ceiling,
                f"ratio >= {TARGET_VS_CEILING}",
                direct >= TARGET_VS_CEILING * ceiling and not run["direct_non_2xx"],
            )
        )
        forwarded = run["forwarded"]["requests_per_s"]
        found.append(Figure("http", f"send via a sync worker, {k} persister(s)", forwarded, "req/s", ceiling))
    two = result["runs"][-1]
    if two.get("direct_cpu_s_per_1000"):
        found.append(
            Figure(
                "http",
                f"CPU-seconds per 1,000 sends, every worker process, {two['persisters']} persisters",
                two["direct_cpu_s_per_1000"],
                "CPU-s",
            )
        )
    return found


def main(argv: list[str]) -> int:
    if argv[:1] == ["--bare"]:
        return _serve_bare(int(argv[1]), argv[2])
    p = argparse.ArgumentParser(prog="fanout bench http", description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", help="an admin URL (benchmark databases are created on it)")
    p.add_argument("--redis-url")
    p.add_argument("--seconds", type=int, default=5, help="duration of each wrk run")
    p.add_argument("--connections", type=int, default=64, help="open connections per wrk run")
    p.add_argument("--threads", type=int, default=2, help="wrk threads")
    p.add_argument(
        "--profile", metavar="DIR", help="profile each worker's CPU during the runs; summaries in DIR"
    )
    p.add_argument("--rooms", type=int, default=16, help="rooms the sends are spread over")
    args = p.parse_args(argv)
    if shutil.which("wrk") is None:
        print(
            "fanout bench http: needs wrk (make bench installs it; or apt-get install wrk)", file=sys.stderr
        )
        return 2
    with given_or_embedded(args.database_url, args.redis_url) as (admin_url, redis_url):
        result = event_loop.run(_run(args, admin_url, redis_url))
    print(json.dumps(result, indent=2))
    for figure in figures(result):
        progress(figure.line())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
