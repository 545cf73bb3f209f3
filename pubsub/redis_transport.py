"""Redis pub/sub transport: the publishing and the subscribing connections of one process.

* `publish_many` sends lines in one write (PUBLISH, or SPUBLISH when sharded), packed here as
  RESP: redis-py's `Pipeline` spent about 30% of the writer's CPU in `fanout bench pubsub`
  profiles packing commands and parsing replies one by one. With `quiet_publish` (one server, not
  a cluster's node) they go out on one link that asked for no replies (`quiet_link.QuietLink`:
  `CLIENT REPLY OFF` first on each new socket, then written straight into the socket), in the
  order they were sent. A PUBLISH's reply (its receiver count) tells the writer nothing it uses,
  and waiting for it woke the writer once more per batch, before its client was answered. A link
  the server closed is seen before the next write (the socket read EOF) and reconnected; lines
  written into a socket that died without a word are lost as any publish may be, and the next
  POSITION makes readers fetch them. Without it (a cluster's nodes, where a MOVED refusal is a
  reply) the replies are read back on a pooled connection like received messages below: one
  `read_response` per socket read, the rest straight from the hiredis reader (each
  `read_response` costs a timeout context).
* `write_keys` writes the hint keys (positions hash, heartbeat) the same way: on the quiet link
  when there is one (no reply, so a refusal goes unseen: the keys are for people and tools, never
  the source of truth), else in one pipeline whose error the caller logs. A writer refreshes them
  at its tick; through a pipeline that cost a redis-py `Retry`, a pool checkout and a reply read
  (2.8 % of an event persister's active samples at 10 events/s; measured alone, 8 keys a tick,
  280-380 µs of CPU a tick through the pipeline against 40-90 µs on the quiet link).
* The subscriber loop reads raw replies (no per-message dict building) and hands the lines of each
  socket read to `on_lines` in one call, in order. It reconnects with capped exponential backoff
  and full jitter.
* Receive fast path: one socket read brings hundreds of messages, but redis-py returns them one
  `parse_response` at a time, each through its retry wrapper, a timeout context and two awaits
  (half the subscriber's CPU in `fanout bench pubsub` profiles). After each `parse_response` the
  loop takes every reply hiredis has already parsed straight from its reader (`_buffered_replies`),
  same order, same connection; the next `parse_response` reads the socket as before, so
  reconnects and their hooks behave exactly as without it. Without hiredis it is skipped.
* redis-py's PubSub reconnects *silently* inside a read and re-subscribes from its `on_connect`
  callback. `_HookedPubSub.on_connect` reports every such reconnect through `on_connection_lost`
  before re-subscribing, so the handler marks streams disconnected; the subscribe confirmations
  that follow trigger `on_subscribed` (REPLICATE, own POSITIONs) as after any first connect.
* `on_subscribed` runs only once *every* channel is confirmed: a REPLICATE sent earlier could
  make writers answer on a channel we do not hear yet.
* A watchdog PINGs when nothing arrived for a while and drops a connection that stays mute, so a
  half-open socket is noticed.
* An (s)unsubscribe we did not ask for (we never unsubscribe: a subscription ends with its
  connection) means the server dropped the channel: a Redis Cluster does so when the channel's slot
  migrates or its shard changes roles. The link is then treated as lost and reconnected.
* `drop_filter(n)` (tests only) drops the n-th publish, counting from 0, to inject message loss.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis._parsers import hiredis as _hiredis_parser
from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from pubsub.metrics import ReplicationMetrics
from pubsub.quiet_link import QuietLink
from pubsub.tasks import cancel_and_wait
from pubsub.ticks import sleep_to_next_run
from pubsub.types import DropFilter

log = logging.getLogger(__name__)

#: What a lost or refused Redis link raises: redis-py's errors, the socket's, and uvloop's
#: RuntimeError for a write on a transport that closed under the client.
LINK_ERRORS: tuple[type[Exception], ...] = (RedisError, OSError, RuntimeError)
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 5.0
SUBSCRIBER_READ_BYTES = 8 * 1024
_MESSAGE_KINDS = (b"message", b"smessage")
# What redis-py's hiredis reader returns when no complete reply is buffered (redis-py < 6: False).
_NOT_ENOUGH_DATA: object = getattr(_hiredis_parser, "NOT_ENOUGH_DATA", False)
_SUBSCRIBE_KINDS = (b"subscribe", b"ssubscribe")
_UNSUBSCRIBE_KINDS = (b"unsubscribe", b"sunsubscribe")


def backoff_delay(attempt: int, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0, min(cap, base * (2 ** min(attempt, 20))))


class DropCounter:
    """The test hook's bookkeeping: numbers every publish from 0 and drops those `drop_filter` picks."""

    __slots__ = ("drop_filter", "metrics", "published")

    def __init__(self, drop_filter: DropFilter, metrics: ReplicationMetrics) -> None:
        self.drop_filter = drop_filter
        self.metrics = metrics
        self.published = 0

    def kept(self, messages: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        result = []
        for message in messages:
            n = self.published
            self.published += 1
            if self.drop_filter(n):
                self.metrics.drop("test_hook")
            else:
                result.append(message)
        return result


def _publish_head(command: bytes, channel: bytes) -> bytes:
    """The start of one (S)PUBLISH in RESP (an array of three bulk strings), up to the data."""
    return b"*3\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(command), command, len(channel), channel)


def pack_publishes(command: bytes, messages: Iterable[tuple[str, str]]) -> tuple[bytes, int, int]:
    """(S)PUBLISH of every (channel, line) in RESP, back to back: (payload, messages, line bytes).

    Built as text and encoded once (a bulk string's length is the line's UTF-8 size, which is its
    length when the line is ASCII): 40% cheaper per line than encoding and framing each line."""
    parts: list[str] = []
    heads: dict[str, str] = {}
    size = 0
    for channel, line in messages:
        head = heads.get(channel)
        if head is None:
            head = heads[channel] = _publish_head(command, channel.encode()).decode()
        length = len(line) if line.isascii() else len(line.encode())
        size += length
        parts.append(f"{head}${length}\r\n{line}\r\n")
    return "".join(parts).encode(), len(parts), size


def pack_commands(commands: Iterable[Sequence[str]]) -> bytes:
    """Each command (its name and arguments, as text) as a RESP array of bulk strings, back to back."""
    parts: list[bytes] = []
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        for arg in command:
            data = arg.encode()
            parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


def _buffered_replies(connection: Any) -> Callable[[], Any] | None:
    """`gets()` of the hiredis reader of a redis-py `connection`: the next complete reply already
    received, or `_NOT_ENOUGH_DATA` when none is buffered; None when the connection does not parse
    with hiredis.

    Reaches into redis-py's parser (`connection._parser._reader`, the same object its
    `read_response` takes replies from); `tests/pubsub` checks that the path is taken.
    """
    reader = getattr(getattr(connection, "_parser", None), "_reader", None)
    gets = getattr(reader, "gets", None)
    if gets is None or type(reader).__module__.split(".")[0] != "hiredis":
        return None
    return gets  # type: ignore[no-any-return]


class _HookedPubSub(PubSub):
    """A PubSub that reports each (re)connect before redis-py re-subscribes on it."""

    def __init__(self, *args: Any, on_reconnect: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_reconnect = on_reconnect

    async def on_connect(self, connection: Any) -> None:
        self._on_reconnect()
        await super().on_connect(connection)


class RedisTransport:
    """Connections to one Redis; see the module docstring for the guarantees."""

    def __init__(
        self,
        url: str,
        *,
        metrics: ReplicationMetrics,
        on_lines: Callable[[list[bytes], float], None],
        on_subscribed: Callable[[], None],
        on_connection_lost: Callable[[], None],
        sharded: bool = False,
        drop_filter: DropFilter | None = None,
        watchdog_s: float = 10.0,
        quiet_publish: bool = False,
    ) -> None:
        self.url = url
        self.sharded = sharded
        self.metrics = metrics
        self._on_lines = on_lines
        self._on_subscribed = on_subscribed
        self._on_connection_lost = on_connection_lost
        self._drops = None if drop_filter is None else DropCounter(drop_filter, metrics)
        self.watchdog_s = watchdog_s
        # RESP2: measurably faster than RESP3 on the receive path with redis-py 8.1.
        self._pub = aioredis.Redis.from_url(url, protocol=2, socket_keepalive=True)
        #: The link `publish_many` and `write_keys` write on without replies (`quiet_publish`,
        #: until the server refuses CLIENT REPLY), else None.
        self._quiet = QuietLink(url) if quiet_publish else None
        # Subscriber reads of 8 KiB, not redis-py's 64 KiB: hiredis moves its unread buffer to
        # the front after every 1 KiB it parses, so a 64 KiB read cost about 3,000 instructions of
        # copying per 200-byte message (callgrind); 8 KiB still takes dozens of messages a read
        # (`fanout bench instructions`: 800 fewer per received message than 16 KiB; 4 KiB costs
        # more again, in reads).
        self._sub_pool = aioredis.ConnectionPool.from_url(
            url, protocol=2, socket_keepalive=True, socket_read_size=SUBSCRIBER_READ_BYTES
        )
        self._channels: list[bytes] = []
        self._confirmed: set[bytes] = set()
        self._pubsub: _HookedPubSub | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_received = 0.0
        self.subscribed = asyncio.Event()
        self.connects = 0

    # -- publishing ----------------------------------------------------------------------------

    async def publish_many(self, messages: Sequence[tuple[str, str]]) -> int:
        """Publish (channel, line) pairs in order in one round trip; returns how many were sent.

        Raises redis errors (the caller decides; pub/sub is at most once anyway).
        """
        if self._drops is not None:
            messages = self._drops.kept(messages)
        payload, sent, size = pack_publishes(b"SPUBLISH" if self.sharded else b"PUBLISH", messages)
        if sent:
            if not await self._send_quiet(payload):
                await self._send_packed(payload, sent)
            self.metrics.bytes_out += size
        return sent

    async def _send_quiet(self, payload: bytes) -> bool:
        """`payload` on the quiet link; False without one, or once the server refused CLIENT REPLY
        (then every write reads its replies from here on, as a cluster's do)."""
        quiet = self._quiet
        if quiet is None:
            return False
        if await quiet.send(payload):
            return True
        self._quiet = None
        return False

    async def _send_packed(self, payload: bytes, replies: int) -> None:
        pool = self._pub.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await connection.send_packed_command(payload, check_health=False)
            gets = _buffered_replies(connection)
            while replies:
                await connection.read_response()  # reads the socket (with its timeout) when needed
                replies -= 1
                while replies and gets is not None and (reply := gets()) is not _NOT_ENOUGH_DATA:
                    if isinstance(reply, Exception):
                        raise reply  # as read_response would
                    replies -= 1
        except BaseException:
            # Replies of this batch may still be in flight: the connection cannot be reused.
            await connection.disconnect(nowait=True)
            raise
        finally:
            await pool.release(connection)

    async def publish(self, channel: str, line: str) -> int:
        return await self.publish_many([(channel, line)])

    @property
    def publisher(self) -> aioredis.Redis:
        """The client of the hint keys (positions hash, heartbeat), and of the publishes whose
        replies are read (without `quiet_publish`, or once the server refused CLIENT REPLY)."""
        return self._pub

    async def hint_client(self) -> aioredis.Redis:
        return self._pub

    async def write_keys(self, commands: Sequence[Sequence[str]]) -> None:
        """Run `commands` (hint-key writes) in order: on the quiet link without replies when
        there is one, else in one pipeline that raises its first error (see the module docstring)."""
        if not commands:
            return
        if await self._send_quiet(pack_commands(commands)):
            return
        pipe = self._pub.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        await pipe.execute()

    # -- subscribing ---------------------------------------------------------------------------

    def start(self, channels: Sequence[str]) -> None:
        self._channels = [c.encode() for c in channels]
        self._task = asyncio.get_running_loop().create_task(self._run(), name="repl-subscriber")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        await self._pub.aclose()
        await self._sub_pool.aclose()
        if self._quiet is not None:
            await self._quiet.close()

    def _reconnected(self) -> None:
        self._confirmed.clear()
        self.subscribed.clear()
        self.metrics.reconnect("silent")
        log.warning("redis pub/sub reconnected under us; marking streams disconnected")
        self._on_connection_lost()

    async def _run(self) -> None:
        attempt = 0
        loop = asyncio.get_running_loop()
        while True:
            pubsub = _HookedPubSub(connection_pool=self._sub_pool, on_reconnect=self._reconnected)
            self._pubsub = pubsub
            watchdog = loop.create_task(self._watchdog(pubsub))
            try:
                self._confirmed.clear()
                if self.sharded:  # one command each: on a cluster, one SSUBSCRIBE takes one slot's channels
                    for channel in self._channels:
                        await pubsub.ssubscribe(channel)
                else:
                    await pubsub.subscribe(*self._channels)
                self._last_received = loop.time()
                await self._read_loop(pubsub, loop)
            except asyncio.CancelledError:
                raise
            except LINK_ERRORS as e:
                delay = backoff_delay(attempt)
                attempt += 1
                log.warning("redis subscriber connection lost (%s); retrying in %.2fs", e, delay)
                self.metrics.reconnect("loop")
                self.subscribed.clear()
                self._on_connection_lost()
                await asyncio.sleep(delay)
                continue
            finally:
                await cancel_and_wait(watchdog)
                await asyncio.shield(pubsub.aclose())  # type: ignore[no-untyped-call]
                self._pubsub = None
            attempt = 0

    async def _read_loop(self, pubsub: _HookedPubSub, loop: asyncio.AbstractEventLoop) -> None:
        on_lines = self._on_lines
        time = loop.time
        while True:
            reply = await pubsub.parse_response(block=True)
            now = time()
            self._last_received = now
            gets = _buffered_replies(pubsub.connection)
            lines: list[bytes] = []
            while reply is not _NOT_ENOUGH_DATA:
                if type(reply) is list and len(reply) == 3 and reply[0] in _MESSAGE_KINDS:
                    lines.append(reply[2])
                else:
                    if lines:  # in order: the messages before this reply first
                        on_lines(lines, now)
                        lines = []
                    self._control_reply(reply)
                if gets is None:
                    break
                reply = gets()
            if lines:
                on_lines(lines, now)

    def _control_reply(self, reply: Any) -> None:
        if isinstance(reply, Exception):
            raise reply  # what redis-py's read_response does with an error reply
        if not isinstance(reply, list) or len(reply) < 3:
            return  # PONG of the watchdog
        if reply[0] in _UNSUBSCRIBE_KINDS and reply[1] in self._channels:
            raise RedisConnectionError(f"the server unsubscribed us from {reply[1].decode(errors='replace')}")
        if reply[0] in _SUBSCRIBE_KINDS:
            self._confirmed.add(reply[1])
            if len(self._confirmed) == len(self._channels) and not self.subscribed.is_set():
                self.connects += 1
                if self.connects > 1:
                    self.metrics.reconnect("subscribed")
                self.subscribed.set()
                self._on_subscribed()

    async def _watchdog(self, pubsub: _HookedPubSub) -> None:
        """PING when quiet; cut a connection that stays mute so the read loop reconnects."""
        loop = asyncio.get_running_loop()
        while True:
            await sleep_to_next_run(self.watchdog_s / 2)
            quiet = loop.time() - self._last_received
            connection = pubsub.connection
            if connection is None:
                continue
            if quiet > 2 * self.watchdog_s:
                log.warning("redis subscriber silent for %.1fs; reconnecting", quiet)
                await connection.disconnect(nowait=True)
            elif quiet > self.watchdog_s:
                try:
                    await pubsub.ping()
                except LINK_ERRORS:
                    await connection.disconnect(nowait=True)
