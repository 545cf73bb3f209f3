"""The bare server (`bare_sync.BareRooms`) as a process of its own, the long-poll benchmarks' ceiling.

`bare_server(name)` runs it (`python -m workers.harness.bench.bare_server PORT SERVER`) on the
event loop the workers use, with the file-descriptor limit raised like the clients', carried by
aiohttp (`bare_sync.bare_app`, fanout's server) or by an ASGI server (`bare_asgi`: uvicorn with
httptools, granian).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from aiohttp import web

from workers.embedded.services import free_port
from workers.harness.bench.bare_sync import bare_app
from workers.harness.bench.poll_clients import raise_fd_limit
from workers.process import event_loop

SERVERS = {"aiohttp": "bare aiohttp", "uvicorn": "bare uvicorn+httptools", "granian": "bare granian"}


def _serve_aiohttp(port: int) -> None:
    async def run() -> None:
        runner = web.AppRunner(bare_app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        await asyncio.Event().wait()

    event_loop.run(run())


def serve(port: int, server: str) -> int:
    """Serve the bare rooms on `port` with `server` (a key of `SERVERS`) until terminated."""
    raise_fd_limit()
    if server == "aiohttp":
        _serve_aiohttp(port)
    else:
        from workers.harness.bench import bare_asgi

        bare_asgi.serve(port, server)
    return 0


def installed(server: str) -> bool:
    """Whether `server` can run here (uvicorn and granian are in the `bench` extra only)."""
    if server == "aiohttp":
        return True
    from workers.harness.bench import bare_asgi

    return bare_asgi.installed(server)


class BareServer:
    """A bare server's process: `url` to talk to it, `pid` (the process that serves, which for
    granian is its worker, not the process started) to read its RSS and CPU."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, pid: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self.pid = pid


def _serving_pid(url: str, process: subprocess.Popen[bytes], within_s: float = 60) -> int:
    deadline = time.monotonic() + within_s
    while process.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                return int(json.loads(answer.read())["pid"])
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the bare server did not start (exit status {process.poll()})")


@contextmanager
def bare_server(server: str = "aiohttp") -> Iterator[BareServer]:
    """Start the bare server on `server`, yield it once it answers, stop it (and any worker
    process it started: it runs in a session of its own) after."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "workers.harness.bench.bare_server", str(port), server],
        stdout=sys.stderr.fileno(),  # the benchmark's stdout is its JSON result; granian logs there
        start_new_session=True,
    )
    try:
        pid = _serving_pid(f"http://127.0.0.1:{port}", process)
        yield BareServer(process, port, pid)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            pass
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "aiohttp"))
