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
dropped with its connection. The proxy does not interpret the bytes, except in front of PostgreSQL
when made with `postgres=True`: it then splits what clients send into protocol messages
(`workers.harness.pg_messages`), and `on_message(match, action)` arms a one-shot rule for the
next message that matches (a COMMIT, say), on whichever connection sends it:

* `DROP_REPLY`: forward it, then drop the client's side of that connection: the server acts on it
  (commits) but its answer never arrives; the server's side stays open (a backend still there).
* `NEVER_ARRIVES`: drop it and the client's side: the server never gets it (the backend waits,
  idle in its transaction).
* `LATE`: drop the client's side now and forward the message `late_s` later: the server acts on it
  after the client gave up.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from workers.embedded.services import free_port
from workers.harness.pg_messages import FrontendMessages, Message

CHUNK = 64 * 1024


@dataclass(eq=False)
class _Link:
    """One proxied connection: the two sockets and the tasks pumping between them."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    #: The client's side was dropped by a rule: the server's side stays open, its output discarded.
    orphaned: bool = False
    #: The rules whose `after` bytes this connection sent.
    primed: set[_Rule] = field(default_factory=set)

    def close(self) -> None:
        for writer in (self.client, self.server):
            writer.close()
        for task in self.tasks:
            task.cancel()

    def orphan(self) -> None:
        self.orphaned = True
        self.client.close()


class OnMessage(enum.Enum):
    """What an armed rule does with the message it matches (see the module docstring)."""

    DROP_REPLY = "drop_reply"
    NEVER_ARRIVES = "never_arrives"
    LATE = "late"


@dataclass(eq=False)
class _Rule:
    match: Callable[[Message], bool]
    action: OnMessage
    late_s: float
    #: Fire only on a connection that sent these bytes before (in an earlier message).
    after: bytes | None
    fired: asyncio.Event = field(default_factory=asyncio.Event)


class FaultProxy:
    """Forwards `127.0.0.1:port` to `target_host:target_port`; see the module docstring."""

    def __init__(self, target_host: str, target_port: int, port: int = 0, *, postgres: bool = False) -> None:
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
        self._postgres = postgres
        self._rules: list[_Rule] = []
        self._late: set[asyncio.Task[None]] = set()

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        self.cut()
        for task in list(self._late):
            task.cancel()
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

    def on_message(
        self,
        match: Callable[[Message], bool],
        action: OnMessage,
        *,
        after: bytes | None = None,
        late_s: float = 0.0,
    ) -> asyncio.Event:
        """Arm a one-shot rule for the next client message that matches, on a connection that sent
        `after` earlier (any connection when None: say, the COMMIT of the transaction that wrote a
        marker); the event is set once it fired. Only on a proxy made with `postgres=True`."""
        if not self._postgres:
            raise ValueError("message rules need a proxy made with postgres=True")
        rule = _Rule(match, action, late_s, after)
        self._rules.append(rule)
        return rule.fired

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
        messages = FrontendMessages() if self._postgres else None
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, link, messages)),
            asyncio.create_task(self._pump(up_reader, writer, link, None, to_client=True)),
        ]

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        link: _Link,
        messages: FrontendMessages | None,
        *,
        to_client: bool = False,
    ) -> None:
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
                if to_client and link.orphaned:
                    continue  # the server's answers to a client that is gone
                if messages is None:
                    sink.write(data)
                elif not self._forward_messages(messages.feed(data), sink, link):
                    return  # a rule dropped the client's side
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not link.orphaned or to_client:
                self._links.discard(link)
                with contextlib.suppress(Exception):
                    link.close()

    def _forward_messages(self, messages: list[Message], sink: asyncio.StreamWriter, link: _Link) -> bool:
        """Write `messages` to the server; False once a rule fired (the client's side is dropped)."""
        for message in messages:
            rule = next(
                (r for r in self._rules if (r.after is None or r in link.primed) and r.match(message)), None
            )
            if rule is None:
                link.primed.update(r for r in self._rules if r.after is not None and r.after in message.raw)
                sink.write(message.raw)
                continue
            self._rules.remove(rule)
            if rule.action is OnMessage.DROP_REPLY:
                sink.write(message.raw)
            elif rule.action is OnMessage.LATE:
                task = asyncio.create_task(self._send_late(sink, message.raw, rule.late_s))
                self._late.add(task)
                task.add_done_callback(self._late.discard)
            link.orphan()
            rule.fired.set()
            return False
        return True

    @staticmethod
    async def _send_late(sink: asyncio.StreamWriter, raw: bytes, late_s: float) -> None:
        await asyncio.sleep(late_s)
        if not sink.is_closing():
            sink.write(raw)
            with contextlib.suppress(OSError):
                await sink.drain()

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
