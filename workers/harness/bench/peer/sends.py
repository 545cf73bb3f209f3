"""Closed-loop senders on raw HTTP/1.1 keep-alive connections: the saturation phase's client.

At saturation the driver shares the machine's two cores with the system it measures. Through
aiohttp's client a send cost the driver 0.16-0.29 ms of CPU, and the driver used a third of the 2
cores at fanout's saturation and a whole core against the bare server: part of what it reported
as a limit was its own. Here each sender owns one connection with one
request in flight, writes a request built from fixed bytes around the txnId, and reads only what
it needs of the answer (the status, then the body's length from `Content-Length` or its chunks),
which costs a few tens of microseconds. The same code drives every target, as before.

An answer without a length (a body delimited by the connection's close) or a connection lost
mid-answer ends the phase with a clear error: neither happens on the targets' keep-alive paths.
"""

from __future__ import annotations

import asyncio
import json
from typing import cast
from urllib.parse import urlsplit


class HttpError(RuntimeError):
    """An answer this client cannot read, or a connection lost while a request was in flight."""


def _framed_length(buffer: bytearray) -> tuple[int, int] | None:
    """(status, bytes the whole answer takes) once `buffer` holds a complete answer, else None."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    try:
        status = int(head[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        raise HttpError(f"not an HTTP status line: {head[0][:80]!r}") from None
    fields = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    start = end + 4
    try:
        if "content-length" in fields:
            total = start + int(fields["content-length"])
            return (status, total) if len(buffer) >= total else None
        if fields.get("transfer-encoding", "").lower() == "chunked":
            at = start
            while True:
                line_end = buffer.find(b"\r\n", at)
                if line_end < 0:
                    return None
                size = int(bytes(buffer[at:line_end]).split(b";")[0], 16)
                at = line_end + 2 + size + 2
                if size == 0:  # the last chunk; a trailer is not expected on these paths
                    return (status, at) if len(buffer) >= at else None
                if len(buffer) < at:
                    return None
    except ValueError:
        raise HttpError(f"an answer with status {status} has an unreadable length") from None
    raise HttpError(f"an answer with status {status} has neither Content-Length nor chunks")


class KeepAlive(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        try:
            framed = _framed_length(self._buffer)
        except HttpError as e:
            waiter.set_exception(e)
            return
        if framed is not None:
            status, length = framed
            del self._buffer[:length]
            waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(
                HttpError(f"connection lost mid-answer: {exc or 'closed by the server'}")
            )

    @property
    def closed(self) -> bool:
        return self._transport is None

    async def request(self, raw: bytes) -> int:
        """Send one whole request; the answer's status once all of it has arrived."""
        if self._transport is None:
            raise HttpError("connection closed")
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(raw)
        return await self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class Sender:
    """A sender's requests to one send path: `PUT {path}{txnId}` with its access token and body."""

    def __init__(self, url: str, path: str, token: str, content: dict[str, str]) -> None:
        where = urlsplit(url)
        self.host, self.port = where.hostname or "127.0.0.1", where.port or 80
        body = json.dumps(content, separators=(",", ":")).encode()
        self._start = f"PUT {path}".encode()
        self._rest = (
            f" HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self._connection: KeepAlive | None = None

    async def open(self) -> None:
        _, self._connection = await asyncio.get_running_loop().create_connection(
            KeepAlive, self.host, self.port
        )

    async def send(self, txn_id: str) -> int:
        """One send with this txnId (already safe in a path); its answer's status. A connection the
        server closed between two answers is opened again."""
        if self._connection is None or self._connection.closed:
            await self.open()
        assert self._connection is not None
        return await self._connection.request(self._start + txn_id.encode() + self._rest)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
