"""A bare aiohttp server speaking just enough of /sync and send to be the long-poll benchmarks' ceiling.

What the benchmarks' client processes do against fanout, they do against this server in the same
run: the difference is what fanout's Matrix layer costs. It keeps no users and no database:

* `GET /_matrix/client/v3/sync?since=N&timeout=MS`: the poll's room is named by its access token
  (`Bearer room:<room id>`; any other token is in no room). Events of that room sent after
  position N are answered at once; otherwise the poll is held until one is sent or the timeout
  ends (then an empty answer). `next_batch` is the position of the last send.
* `PUT /_matrix/client/v3/rooms/{room}/send/{type}/{txnId}`: appends the JSON body as an event's
  content (the last `KEPT` per room are kept) and wakes the room's held polls.
* `/health`, and `/metrics` with `fanout_sync_waiting` (polls held), as a sync worker serves them.

`BareServer` runs it as a process of its own (`python -m workers.harness.bench.bare_sync PORT`)
on the event loop the workers use, with the file-descriptor limit raised like the clients'.
"""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from aiohttp import web

from workers import event_loop
from workers.harness.bench.poll_clients import CLIENT, raise_fd_limit
from workers.services import free_port

#: Events kept per room: enough for any poll that is behind by less than that many sends.
KEPT = 1000


def bare_app() -> web.Application:
    position = [0]
    events: dict[str, collections.deque[tuple[int, dict[str, object]]]] = collections.defaultdict(
        lambda: collections.deque(maxlen=KEPT)
    )
    wake: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)
    held = [0]

    def answer(room: str, since: int) -> web.Response:
        fresh = [event for at, event in events.get(room, ()) if at > since]
        body: dict[str, object] = {"next_batch": str(position[0])}
        if fresh:
            body["rooms"] = {"join": {room: {"timeline": {"events": fresh, "limited": False}}}}
        return web.json_response(body)

    async def sync(request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        room = token.removeprefix("room:") if token.startswith("room:") else ""
        try:
            since = int(request.query.get("since", "0"))
            timeout_s = int(request.query.get("timeout", "0")) / 1000
        except ValueError:
            return web.json_response({"errcode": "M_INVALID_PARAM", "error": "bad since"}, status=400)
        if since < position[0] and any(at > since for at, _ in events.get(room, ())):
            return answer(room, since)
        held[0] += 1
        try:
            with suppress(TimeoutError):
                await asyncio.wait_for(wake[room].wait(), timeout_s)
        finally:
            held[0] -= 1
        return answer(room, since)

    async def send(request: web.Request) -> web.Response:
        room = request.match_info["room"]
        content = json.loads(await request.read())
        position[0] += 1
        event_id = f"$bare{position[0]}"
        event = {
            "event_id": event_id,
            "type": request.match_info["type"],
            "sender": "@bare:localhost",
            "origin_server_ts": int(time.time() * 1000),
            "content": content,
        }
        events[room].append((position[0], event))
        woken = wake.pop(room, None)
        if woken is not None:
            woken.set()
        return web.json_response({"event_id": event_id})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=f"fanout_sync_waiting {held[0]}\n")

    app = web.Application()
    app.router.add_get(CLIENT + "/sync", sync)
    app.router.add_put(CLIENT + "/rooms/{room}/send/{type}/{txn}", send)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


def serve(port: int) -> int:
    raise_fd_limit()

    async def run() -> None:
        runner = web.AppRunner(bare_app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    event_loop.run(run())
    return 0


class BareServer:
    """The bare server's process: `url` to talk to it, `pid` to read its RSS and CPU."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self.pid = process.pid


@contextmanager
def bare_server() -> Iterator[BareServer]:
    """Start the bare server, yield it once it listens, stop it after."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "workers.harness.bench.bare_sync", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the bare server did not start")
        yield BareServer(process, port)
    finally:
        process.terminate()
        process.wait()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
