"""The messages a PostgreSQL client sends, split out of its byte stream, for the fault proxy's rules.

The frontend protocol: first untyped packets (`int32 length, int32 code, ...`): an SSLRequest or
GSSENCRequest (answered by the server with one byte), then the StartupMessage; after it, typed
messages (`byte type, int32 length, body`), the length counting itself but not the type byte. A
connection that turns to TLS, or anything unexpected, makes the rest opaque: passed on as is.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_PROTOCOL_3 = 196608
#: Larger than any startup packet: the bytes are not a packet (a TLS handshake after SSLRequest).
_MAX_STARTUP = 10_000


@dataclass(frozen=True, slots=True)
class Message:
    """One frontend message: `kind` its type byte (b"" for a startup packet or opaque bytes)."""

    kind: bytes
    body: bytes
    raw: bytes

    def is_query(self, text: str) -> bool:
        """A simple-protocol Query whose text is `text` (case and a trailing `;` aside)."""
        if self.kind != b"Q":
            return False
        sql = self.body.rstrip(b"\x00").decode(errors="replace").strip().rstrip(";").strip()
        return sql.upper() == text.upper()


def is_commit(message: Message) -> bool:
    """COMMIT, as asyncpg sends it at the end of a transaction block."""
    return message.is_query("COMMIT")


def is_copy_done(message: Message) -> bool:
    """CopyDone: the end of a COPY FROM STDIN, which commits it when it runs on its own."""
    return message.kind == b"c"


def is_sync(message: Message) -> bool:
    """Sync: the end of an extended-protocol statement, which commits it when it runs on its own."""
    return message.kind == b"S"


class FrontendMessages:
    """Feed it the client's bytes in order; it returns the complete messages, keeping partial ones."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._typed = False
        self._opaque = False

    def feed(self, data: bytes) -> list[Message]:
        if self._opaque:
            return [Message(b"", data, data)]
        self._buffer += data
        messages: list[Message] = []
        while True:
            message = self._next()
            if message is None:
                return messages
            messages.append(message)

    def _next(self) -> Message | None:
        buffer = self._buffer
        if self._opaque:
            if not buffer:
                return None
            raw = bytes(buffer)
            buffer.clear()
            return Message(b"", raw, raw)
        head = 5 if self._typed else 4
        if len(buffer) < head:
            return None
        if self._typed:
            kind = bytes(buffer[:1])
            (length,) = struct.unpack_from("!i", buffer, 1)
            total = 1 + length
        else:
            kind = b""
            (length,) = struct.unpack_from("!i", buffer, 0)
            total = length
            if not 8 <= length <= _MAX_STARTUP:
                self._opaque = True
                return self._next()
        if length < 4:
            self._opaque = True
            return self._next()
        if len(buffer) < total:
            return None
        raw = bytes(buffer[:total])
        del buffer[:total]
        body = raw[head:]
        if not self._typed:
            (code,) = struct.unpack_from("!i", raw, 4)
            if code == _PROTOCOL_3:
                self._typed = True
            elif code not in (_SSL_REQUEST, _GSSENC_REQUEST):
                self._opaque = True  # a CancelRequest or an unknown protocol
        return Message(kind, body, raw)
