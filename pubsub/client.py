"""`ReplicationClient`: the one object a worker process creates to replicate its streams.

It wires a transport (`RedisTransport`, or `RedisClusterTransport` when `redis_cluster` is set),
a `ReplicationHandler` (reader side, for the streams it reads) and a `StreamPublisher` (writer
side, for the streams whose writer list holds this instance).

On every (re)subscription, in this order: the transport reports the connection lost (streams
wait for a POSITION), SUBSCRIBE is confirmed for every channel, then REPLICATE is published and
our own positions are announced. See `pubsub.handler` for the reader rules and
`pubsub.publisher` for the writer contract.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from pubsub import keys
from pubsub.handler import ReplicationHandler, UserSyncListener
from pubsub.metrics import ReplicationMetrics
from pubsub.publisher import StreamPublisher
from pubsub.redis_cluster_transport import RedisClusterTransport
from pubsub.redis_transport import LINK_ERRORS, RedisTransport
from pubsub.streams import ApplyCallback, Stream, StreamRegistry
from pubsub.tasks import cancel_and_wait
from pubsub.ticks import sleep_to_next_run
from pubsub.types import DropFilter, PositionListener, Row, Transport
from pubsub.wire import REPLICATE, ClearUserSync, Command, UserSync, command_name, format_command

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicationSettings:
    """What the client needs from a worker's configuration (`workers.config.WorkerConfig` has it all)."""

    instance_name: str
    redis_url: str
    #: Node URLs of a Redis Cluster: when given, the cluster transport is used and `redis_url` is not.
    redis_cluster: tuple[str, ...] = ()
    channel_prefix: str = "fanout"
    per_stream_channels: bool = False
    sharded_pubsub: bool = False
    #: Read a reply to every publish on one server (else `CLIENT REPLY OFF`, see `RedisTransport`).
    publish_replies: bool = False
    announce_interval_s: float = 1.0
    silent_writer_intervals: int = 5
    max_line_bytes: int = 1 << 20
    catch_up_batch_size: int = 1000
    queue_size: int = 10_000

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> ReplicationSettings:
        """Build from a `WorkerConfig` (duck-typed so `pubsub` does not import `workers`)."""
        values = {
            "instance_name": config.instance_name,
            "redis_url": config.redis_url,
            "redis_cluster": tuple(config.redis_cluster),
            "channel_prefix": config.channel_prefix,
            "per_stream_channels": config.per_stream_channels,
            "sharded_pubsub": config.sharded_pubsub,
            "publish_replies": config.publish_replies,
            "announce_interval_s": config.position_announce_interval_s,
            "silent_writer_intervals": config.silent_writer_intervals,
            "max_line_bytes": config.max_line_bytes,
            "catch_up_batch_size": config.catch_up_batch_size,
        }
        values.update(overrides)
        return cls(**values)


async def _ignore_rows(stream: Stream[Any], instance: str, token: int, rows: Sequence[Row]) -> None:
    return None


class ReplicationClient:
    """Replication for one process: publish the streams it writes, apply the streams it reads.

    `streams`: every stream of the cluster this process knows. `read`: names of the streams to
    subscribe to (default: all); writers of other streams are not heard. `positions_only`: read
    streams whose rows this process does not apply; it follows their writers' positions only
    (see `ReplicationHandler`). `apply` receives the rows of the other read streams (see
    `ReplicationHandler` for the order contract).
    """

    def __init__(
        self,
        settings: ReplicationSettings,
        streams: Sequence[Stream[Any]],
        *,
        apply: ApplyCallback | None = None,
        read: Iterable[str] | None = None,
        positions_only: Iterable[str] = (),
        drop_filter: DropFilter | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = ReplicationMetrics(registry)
        every = StreamRegistry(streams)
        read_names = {s.name for s in every} if read is None else set(read)
        self.read_streams = StreamRegistry([every[name] for name in sorted(read_names)])
        self.written_streams = every.written_by(settings.instance_name)
        self.handler = ReplicationHandler(
            settings.instance_name,
            self.read_streams,
            apply or _ignore_rows,
            metrics=self.metrics,
            other_streams=[s.name for s in every if s.name not in read_names],
            positions_only=positions_only,
            max_line_bytes=settings.max_line_bytes,
            catch_up_batch_size=settings.catch_up_batch_size,
            queue_size=settings.queue_size,
        )
        self.transport = self._transport(drop_filter)
        self.publisher = StreamPublisher(
            settings.instance_name,
            self.written_streams,
            self.transport,
            metrics=self.metrics,
            prefix=settings.channel_prefix,
            per_stream_channels=settings.per_stream_channels,
            announce_interval_s=settings.announce_interval_s,
            heartbeat_ttl_s=settings.announce_interval_s * settings.silent_writer_intervals,
            # Half the readers' silence threshold: an idle writer is never taken for a silent one.
            keepalive_intervals=max(1, settings.silent_writer_intervals // 2),
        )
        self.handler.on_replicate = self.publisher.request_announce_all
        self._base_channel = keys.base_channel(settings.channel_prefix)
        self._pending: set[asyncio.Task[None]] = set()
        self._health_task: asyncio.Task[None] | None = None
        self._silent: set[tuple[str, str]] = set()
        self._started = False

    def _transport(self, drop_filter: DropFilter | None) -> Transport:
        settings = self.settings
        links: dict[str, Any] = {
            "metrics": self.metrics,
            "on_lines": self.handler.handle_lines,
            "on_subscribed": self._subscribed,
            "on_connection_lost": self.handler.connection_lost,
            "sharded": settings.sharded_pubsub,
            "drop_filter": drop_filter,
            "watchdog_s": max(5.0, 3 * settings.announce_interval_s),
        }
        if settings.redis_cluster:
            return RedisClusterTransport(settings.redis_cluster, home=settings.instance_name, **links)
        return RedisTransport(settings.redis_url, quiet_publish=not settings.publish_replies, **links)

    def channels(self) -> list[str]:
        """The channels this process subscribes to: the base one plus read streams' own."""
        result = [self._base_channel]
        if self.settings.per_stream_channels:
            result += [
                keys.stream_channel(self.settings.channel_prefix, s.name, True) for s in self.read_streams
            ]
        return result

    # -- application API -----------------------------------------------------------------------

    def add_position_listener(self, listener: PositionListener) -> None:
        """`listener(stream, instance, token)` after the generator advanced (wake waiting readers here)."""
        self.handler.position_listeners.append(listener)

    def add_foreign_writer_listener(self, listener: Callable[[str, str], None]) -> None:
        """`listener(stream, instance)` for each refused line of an instance that is not one of the
        stream's writers here: this process cannot know what that writer wrote."""
        self.handler.foreign_writer_listeners.append(listener)

    def add_user_sync_listener(self, listener: UserSyncListener) -> None:
        self.handler.user_sync_listeners.append(listener)

    def stage_rows(self, stream: str, rows: Iterable[tuple[int, Row | str]]) -> None:
        """See `StreamPublisher.stage_rows`: (token, row) pairs, before the IDs finish; then `notify`."""
        self.publisher.stage_rows(stream, rows)

    def stage_unknown(self, stream: str, token: int) -> None:
        """See `StreamPublisher.stage_unknown`: rows at `token` may exist, unknown here."""
        self.publisher.stage_unknown(stream, token)

    def notify(self, stream: str | None = None) -> None:
        self.publisher.notify(stream)

    async def send(self, cmd: Command) -> None:
        """Publish a cluster-wide command (USER_SYNC, CLEAR_USER_SYNC, REPLICATE) on the base channel."""
        await self.transport.publish(self._base_channel, format_command(cmd))
        self.metrics.command_out(command_name(cmd), "")

    async def send_user_sync(self, cmd: UserSync | ClearUserSync) -> None:
        await self.send(cmd)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, *, wait_subscribed: float | None = 10.0) -> None:
        """Start reading and publishing; by default wait until the first subscription is confirmed."""
        self.handler.start()
        self.publisher.start()
        self.transport.start(self.channels())
        loop = asyncio.get_running_loop()
        self._health_task = loop.create_task(self._health_loop(), name="repl-health")
        self._started = True
        if wait_subscribed is not None:
            await asyncio.wait_for(self.transport.subscribed.wait(), wait_subscribed)

    async def stop(self) -> None:
        """Stop tasks and close connections. A final flush publishes what is ready."""
        if not self._started:
            return
        self._started = False
        if self._health_task is not None:
            await cancel_and_wait(self._health_task)
        await self.publisher.stop()
        try:
            await self.publisher.flush(announce=True)
        except Exception:  # best effort at shutdown: readers catch up anyway
            log.debug("final flush failed", exc_info=True)
        await cancel_and_wait(*self._pending)
        await self.handler.stop()
        await self.transport.stop()

    async def __aenter__(self) -> ReplicationClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_heard(self, writers: Mapping[str, Iterable[str]], within_s: float) -> set[tuple[str, str]]:
        """Wait (at most `within_s`) until every other writer of `writers` (stream -> writers) has
        been heard on this connection; the (stream, writer) pairs still unheard."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s

        def unheard() -> set[tuple[str, str]]:
            return {
                (stream, writer)
                for stream, names in writers.items()
                for writer in names
                if writer != self.settings.instance_name and not self.handler.is_connected(stream, writer)
            }

        pending = unheard()
        while pending and loop.time() < deadline:
            await asyncio.sleep(0.05)
            pending = unheard()
        return pending

    def _subscribed(self) -> None:
        task = asyncio.get_running_loop().create_task(self._after_subscribe())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _after_subscribe(self) -> None:
        try:
            await self.send(REPLICATE)
        except LINK_ERRORS as e:
            log.warning("could not send REPLICATE (%s); periodic POSITIONs will still arrive", e)
        self.publisher.request_announce_all()

    # -- health --------------------------------------------------------------------------------

    @property
    def silent_after_s(self) -> float:
        return self.settings.announce_interval_s * self.settings.silent_writer_intervals

    async def _health_loop(self) -> None:
        """Log each writer that fell silent or was heard again; `health()` computes its answer
        itself, so the log may lag by half the silence threshold."""
        loop = asyncio.get_running_loop()
        while True:
            await sleep_to_next_run(max(self.settings.announce_interval_s, self.silent_after_s / 2))
            silent = {(s, w) for s, w, _ in self.handler.silent_writers(loop.time(), self.silent_after_s)}
            for stream, writer in sorted(silent - self._silent):
                log.warning("writer silent: stream=%s instance=%s for more than %.1fs", stream, writer,
                            self.silent_after_s)  # fmt: skip
            for stream, writer in sorted(self._silent - silent):
                log.info("writer heard again: stream=%s instance=%s", stream, writer)
            self._silent = silent

    def health(self) -> dict[str, Any]:
        """For /health: subscribed?, silent writers, per stream and writer positions, own positions."""
        now = asyncio.get_running_loop().time()
        silent = self.handler.silent_writers(now, self.silent_after_s)
        return {
            "subscribed": self.transport.subscribed.is_set(),
            "ok": self.transport.subscribed.is_set() and not silent,
            "silent_writers": [{"stream": s, "instance": w, "quiet_s": round(q, 3)} for s, w, q in silent],
            "streams": self.handler.stream_status(now),
            "announced": self.publisher.positions(),
            "rejected": self.metrics.value("fanout_repl_rejected_total"),
        }

    def __repr__(self) -> str:
        reads = [s.name for s in self.read_streams]
        writes = [s.name for s in self.written_streams]
        subscribed = self.transport.subscribed.is_set()
        return f"ReplicationClient({self.settings.instance_name!r}, {reads=}, {writes=}, {subscribed=})"
