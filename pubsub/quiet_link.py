"""`QuietLink`: one connection to one Redis server that asked for no replies (`CLIENT REPLY OFF`).

A writer's publishes and hint-key writes need no answer (a PUBLISH's reply only counts who heard
it), so on one server they go out here, in the order they were sent. The connection is redis-py's
(it parses the URL and does TLS, AUTH and SELECT), but a send writes straight into its socket: a
checkout of redis-py's pool (its deprecated-argument wrapper, a timeout context, a health read)
and its `send_packed_command` cost 105-150 µs of CPU per publish against 35-55 µs written straight
(measured alone, one line a millisecond apart), on the path between a writer's commit and its
client's answer.

Contract:
* `send(payload)` writes RESP commands and returns True, or False once the server refused
  `CLIENT REPLY` (an ACL without it, a proxy): it is asked once per socket, with OFF then ON, whose
  one `+OK` says it was taken; from then on the link is done and the caller reads replies itself.
* Order: a send that finds the link ready writes before it yields; one that must (re)connect
  holds a lock, and every send after it queues behind it, so batches reach Redis as they were sent.
* A socket the server closed has read EOF (nothing else ever comes back on it) and is replaced
  before the next write. Bytes written into a socket that died without a word are lost, as any
  publish may be; the writer's next POSITION makes readers fetch what they missed.
* Connection errors are raised (redis-py's `ConnectionError`, `OSError`) for the caller to count.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

log = logging.getLogger(__name__)

#: What a quiet socket is sent first (no reply to it, nor after it), and what it sends once behind
#: it on a new socket to learn that the server takes it (+OK).
REPLY_OFF = b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$3\r\nOFF\r\n"
REPLY_ON = b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$2\r\nON\r\n"


class QuietLink:
    """See the module docstring."""

    def __init__(self, url: str) -> None:
        # The pool only makes the connection (URL, TLS, credentials); it never holds it.
        self._factory = aioredis.ConnectionPool.from_url(url, protocol=2, socket_keepalive=True)
        self._connection: Any = None
        #: The socket writer that was sent REPLY_OFF, while it is open; None before and after.
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._queued = 0
        self.refused = False
        self.connects = 0

    def _ready(self) -> asyncio.StreamWriter | None:
        writer = self._writer
        if writer is None or writer.is_closing():
            return None
        reader = self._connection._reader
        if reader is None or reader.at_eof():
            return None
        return writer

    async def send(self, payload: bytes) -> bool:
        if self.refused:
            return False
        if not self._queued and (writer := self._ready()) is not None:
            writer.write(payload)
            await writer.drain()
            return True
        self._queued += 1
        try:
            async with self._lock:
                writer = self._ready() or await self._connect()
                if writer is None:
                    return False
                writer.write(payload)
        finally:
            self._queued -= 1
        await writer.drain()
        return True

    async def _connect(self) -> asyncio.StreamWriter | None:
        if self.refused:
            return None
        self._writer = None
        if self._connection is not None:
            await self._connection.disconnect(nowait=True)
        else:
            self._connection = self._factory.make_connection()  # type: ignore[no-untyped-call]
        connection = self._connection
        await connection.connect()
        await connection.send_packed_command(REPLY_OFF + REPLY_ON, check_health=False)
        try:
            await connection.read_response()
        except ResponseError as e:
            log.warning("redis refused CLIENT REPLY (%s): every publish reads its replies", e)
            self.refused = True
            await connection.disconnect(nowait=True)
            return None
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        writer: asyncio.StreamWriter = connection._writer
        writer.write(REPLY_OFF)
        self._writer = writer
        self.connects += 1
        return writer

    def socket_name(self) -> tuple[str, int] | None:
        """The link's local (host, port), as `CLIENT LIST` shows it; None when not connected (for
        tests and people: nothing on the send path asks)."""
        writer = self._ready()
        if writer is None:
            return None
        host, port = writer.get_extra_info("sockname")[:2]
        return host, port

    def unread(self) -> int:
        """Bytes the server sent that nobody read: 0 on a link that asked for no replies."""
        reader = None if self._connection is None else self._connection._reader
        return 0 if reader is None else len(reader._buffer)

    async def close(self) -> None:
        self._writer = None
        if self._connection is not None:
            await self._connection.disconnect(nowait=True)
        await self._factory.aclose()
