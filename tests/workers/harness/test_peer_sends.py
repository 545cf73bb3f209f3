"""The peer run's closed-loop sender: raw HTTP/1.1 keep-alive, against a real loopback server.

The server here is asyncio's own (it answers with whatever framing a case needs, byte by byte
where it matters); the peer run's test drives the same sender against fanout, Synapse and the
bare aiohttp server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from workers.harness.bench.peer.sends import HttpError, Sender, _framed_length

ROUTE = "/_matrix/client/v3/rooms/%21r%3Ax/send/m.room.message/"


def answer(status: int, body: bytes, *, chunked: bool = False, close: bool = False) -> bytes:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
    if close:
        head += "Connection: close\r\n"
    if chunked:
        middle = len(body) // 2
        parts = [body[:middle], body[middle:]]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + framed
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@dataclass
class Server:
    """A loopback server answering each request with `reply(index)` (None: close mid-answer)."""

    reply: Callable[[int], bytes | None]
    byte_by_byte: bool = False
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    connections: int = 0
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                fields = dict(line.split(": ", 1) for line in lines[1:] if line)
                body = await reader.readexactly(int(fields["Content-Length"]))
                self.requests.append((lines[0], fields, body))
                out = self.reply(len(self.requests) - 1)
                if out is None:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{")
                    await writer.drain()
                    break
                for piece in [out[i : i + 1] for i in range(len(out))] if self.byte_by_byte else [out]:
                    writer.write(piece)
                    await writer.drain()
                if b"Connection: close" in out:
                    break
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., asyncio.Future[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(reply: Callable[[int], bytes | None], byte_by_byte: bool = False) -> Server:
        state = Server(reply, byte_by_byte)
        server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
        state.port = server.sockets[0].getsockname()[1]
        servers.append(server)
        return state

    yield start  # type: ignore[misc]
    for server in servers:
        server.close()


async def test_sends_go_out_on_one_connection_with_the_token_body_and_txn_ids(
    serve: Callable[..., asyncio.Future[Server]],
) -> None:
    server = await serve(lambda i: answer(200 if i != 1 else 429, b'{"event_id":"$e%d"}' % i))
    sender = Sender(f"http://127.0.0.1:{server.port}", ROUTE, "tok", {"msgtype": "m.text", "body": "hi"})
    await sender.open()
    statuses = [await sender.send(f"t{n}") for n in range(3)]
    sender.close()
    assert statuses == [200, 429, 200]
    assert server.connections == 1
    assert [line for line, _, _ in server.requests] == [f"PUT {ROUTE}t{n} HTTP/1.1" for n in range(3)]
    _, fields, body = server.requests[0]
    assert fields["Authorization"] == "Bearer tok" and fields["Host"] == f"127.0.0.1:{server.port}"
    assert json.loads(body) == {"msgtype": "m.text", "body": "hi"}


async def test_answers_in_pieces_and_in_chunks_are_read_whole(
    serve: Callable[..., asyncio.Future[Server]],
) -> None:
    server = await serve(
        lambda i: answer(200 + i, b'{"event_id":"$long"}' * 20, chunked=i % 2 == 1), byte_by_byte=True
    )
    sender = Sender(f"http://127.0.0.1:{server.port}", ROUTE, "tok", {"body": "x"})
    statuses = [await sender.send(f"t{n}") for n in range(4)]
    sender.close()
    assert statuses == [200, 201, 202, 203]  # a status read early would shift the next ones
    assert server.connections == 1


async def test_a_connection_the_server_closed_after_its_answer_is_opened_again(
    serve: Callable[..., asyncio.Future[Server]],
) -> None:
    server = await serve(lambda i: answer(200, b"{}", close=True))
    sender = Sender(f"http://127.0.0.1:{server.port}", ROUTE, "tok", {"body": "x"})
    statuses = []
    for n in range(3):
        statuses.append(await sender.send(f"t{n}"))
        await asyncio.sleep(0.05)  # the close reaches the client
    sender.close()
    assert statuses == [200, 200, 200] and server.connections == 3


async def test_a_connection_lost_mid_answer_is_a_clear_error(
    serve: Callable[..., asyncio.Future[Server]],
) -> None:
    server = await serve(lambda i: None)
    sender = Sender(f"http://127.0.0.1:{server.port}", ROUTE, "tok", {"body": "x"})
    with pytest.raises(HttpError, match="connection lost mid-answer"):
        await asyncio.wait_for(sender.send("t0"), 10)
    sender.close()


def test_framing_of_answers() -> None:
    whole = answer(200, b"{}")
    assert _framed_length(bytearray(whole)) == (200, len(whole))
    assert _framed_length(bytearray(whole[:-1])) is None
    assert _framed_length(bytearray(whole + b"HTTP/1.1")) == (200, len(whole))  # the next answer stays
    chunked = answer(404, b'{"errcode":"M_NOT_FOUND"}', chunked=True)
    assert _framed_length(bytearray(chunked)) == (404, len(chunked))
    assert all(_framed_length(bytearray(chunked[:n])) is None for n in range(len(chunked)))
    with pytest.raises(HttpError, match="neither Content-Length nor chunks"):
        _framed_length(bytearray(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\n{}"))
    for bad in (b"Content-Length: x", b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"):
        with pytest.raises(HttpError, match="unreadable length"):
            _framed_length(bytearray(b"HTTP/1.1 200 OK\r\n" + bad + b"\r\n\r\n"))
    with pytest.raises(HttpError, match="not an HTTP status line"):
        _framed_length(bytearray(b"garbage\r\n\r\n"))
