"""A TCP proxy on loopback that tests and `make chaos` use to cut, delay, throttle or silence a link.

Put it between a worker and its Redis or PostgreSQL (point the worker's URL at `proxy.port`) and
change the link while the worker runs, without touching either process:

* `cut()`: close every open connection and refuse new ones (accepted, then closed at once) until
  `restore()`; the worker sees a server going away.
* `silence()`: keep every connection open but forward nothing, either way, until `restore()`;
  the worker sees a server alive but mute (what a half-open socket looks like).
* `delay(seconds)`: hold each chunk that long before forwarding it, both ways (order is kept).
* `throttle(bytes_per_second)`: forward at most that many bytes per second per direction.
* `restore()`: back to a plain proxy (delay and throttle off; new connections accepted).

State changes apply to data already in flight: a chunk waiting out a delay when `cut()` runs is
dropped with its connection. The proxy never interprets the bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from workers.services import free_port

CHUNK = 64 * 1024


@dataclass(eq=False)
class _Link:
    """One proxied connection: the two sockets and the tasks pumping between them."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self) -> None:
        for writer in (self.client, self.server):
            writer.close()
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """Forwards `127.0.0.1:port` to `target_host:target_port`; see the module docstring."""

    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = port or free_port()
        self.connections_accepted = 0
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._open = asyncio.Event()  # set: forwarding; clear: silenced
        self._open.set()
        self._refusing = False
        self._delay_s = 0.0
        self._rate: float | None = None

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- faults -----------------------------------------------------------------------------------

    def cut(self) -> None:
        """Close every connection now and refuse new ones until `restore()`."""
        self._refusing = True
        for link in list(self._links):
            link.close()
        self._links.clear()

    def silence(self) -> None:
        """Forward nothing, either way, and close nothing, until `restore()`."""
        self._open.clear()

    def delay(self, seconds: float) -> None:
        self._delay_s = max(0.0, seconds)

    def throttle(self, bytes_per_second: float | None) -> None:
        self._rate = bytes_per_second

    def restore(self) -> None:
        self._refusing = False
        self._delay_s = 0.0
        self._rate = None
        self._open.set()

    @property
    def open_connections(self) -> int:
        return len(self._links)

    # -- forwarding -------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        if self._refusing:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.close()
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, link)),
            asyncio.create_task(self._pump(up_reader, writer, link)),
        ]

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, link: _Link) -> None:
        try:
            while True:
                data = await source.read(CHUNK)
                if not data:
                    break
                if self._delay_s:
                    await asyncio.sleep(self._delay_s)
                await self._open.wait()
                if self._rate:
                    await asyncio.sleep(len(data) / self._rate)
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._links.discard(link)
            with contextlib.suppress(Exception):
                link.close()

    def __repr__(self) -> str:
        state = "cut" if self._refusing else "silent" if not self._open.is_set() else "open"
        return (
            f"<FaultProxy :{self.port} -> {self.target_host}:{self.target_port} {state}"
            f" delay={self._delay_s}s rate={self._rate} links={len(self._links)}>"
        )


def target_of(url: str) -> tuple[str, int]:
    """(host, port) of a `postgresql://` or `redis://` URL (a TCP one: a proxy cannot sit on a socket)."""
    parts = urlsplit(url)
    if not parts.hostname or not parts.port:
        raise ValueError(f"{url!r} names no TCP host and port")
    return parts.hostname, parts.port


def through(url: str, proxy: FaultProxy) -> str:
    """`url` pointed at the proxy instead of its server (user, password, path and query kept)."""
    parts = urlsplit(url)
    credentials, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{credentials}{at}127.0.0.1:{proxy.port}"))
