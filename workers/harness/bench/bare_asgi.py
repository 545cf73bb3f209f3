"""The bare server's rooms (`bare_sync.BareRooms`) as a plain ASGI application, run on uvicorn (with
httptools and uvloop) or on granian: the per-request cost of a faster HTTP server than aiohttp,
measured with the same clients and the same parking, so `fanout bench crowd` can show which
server's own work is the floor under a re-poll.

No framework sits between the server and the rooms (no router, no request object): what is
measured is the server. A held poll does not watch for its client going away (neither does the
aiohttp one): the benchmarks' clients never do. uvicorn, httptools and granian come with the
`bench` extra (`pip install 'fanout[bench]'`); fanout's workers do not need them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from workers.harness.bench.bare_sync import MAX_HELD, BadRequest, BareRooms, bad_request
from workers.harness.bench.poll_clients import CLIENT
from workers.process import event_loop

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: What each ASGI server needs importable.
NEEDS = {"uvicorn": ("uvicorn", "httptools", "uvloop"), "granian": ("granian", "uvloop")}
_JSON = [(b"content-type", b"application/json")]
_TEXT = [(b"content-type", b"text/plain")]
_SEND = CLIENT + "/rooms/"


def installed(server: str) -> bool:
    """Whether every module `server` needs is importable."""
    return all(importlib.util.find_spec(name) is not None for name in NEEDS[server])


def asgi_app() -> App:
    """A fresh bare server as an ASGI application (the lifespan protocol answered, nothing done)."""
    rooms = BareRooms()

    async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def read_body(receive: Receive) -> bytes:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            if method == "GET" and path == CLIENT + "/sync":
                query = dict(parse_qsl(scope["query_string"].decode("latin-1")))
                authorization = next(
                    (v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), ""
                )
                body = await rooms.sync(authorization, query.get("since"), query.get("timeout"))
                return await respond(send, 200, body, _JSON)
            if method == "PUT" and path.startswith(_SEND):
                parts = path[len(_SEND) :].split("/")
                if len(parts) == 4 and parts[1] == "send":
                    body = rooms.send(parts[0], parts[2], await read_body(receive))
                    return await respond(send, 200, body, _JSON)
        except BadRequest as e:
            return await respond(send, 400, bad_request(e), _JSON)
        if method == "GET" and path == "/health":
            return await respond(send, 200, rooms.health(), _JSON)
        if method == "GET" and path == "/metrics":
            return await respond(send, 200, rooms.metrics(), _TEXT)
        await respond(send, 404, b'{"errcode":"M_UNRECOGNIZED"}', _JSON)

    return app


def serve(port: int, server: str) -> None:
    """Serve a fresh `asgi_app()` on 127.0.0.1:`port` with `server` until terminated (SIGTERM).
    Each server runs one worker on uvloop, HTTP/1.1 only, no access log, a backlog of 4,096,
    as the aiohttp bare server does. Stopping either ends the polls still held, which uvicorn
    logs as an error and granian as a warning: uvicorn logs only what is critical, granian only
    errors."""
    if server == "uvicorn":
        import uvicorn

        config = uvicorn.Config(
            asgi_app(), host="127.0.0.1", port=port, loop="none", http="httptools", ws="none",
            lifespan="off", access_log=False, log_level="critical", backlog=4096,
            timeout_graceful_shutdown=1,
        )  # fmt: skip
        event_loop.run(uvicorn.Server(config).serve())
    elif server == "granian":
        from granian.constants import HTTPModes, Interfaces, Loops
        from granian.log import LogLevels
        from granian.server import Server

        Server(
            f"{__name__}:asgi_app", address="127.0.0.1", port=port, interface=Interfaces.ASGINL, workers=1,
            loop=Loops.uvloop, http=HTTPModes.http1, websockets=False, backlog=4096,
            backpressure=MAX_HELD, log_level=LogLevels.error, factory=True, workers_kill_timeout=1,
        ).serve()  # fmt: skip
    else:
        raise ValueError(f"no such ASGI server: {server}")
