"""Typing, presence and worker requests, wired into a worker by one call from `app.py`:

    self.ephemeral = install_ephemeral(application, self)   # in Worker._serve, before runner.setup()

It mounts the `/_fanout/internal/...` routes on the worker's aiohttp application and starts and
stops with it (aiohttp's on_startup / on_shutdown: at shutdown it sends CLEAR_USER_SYNC first).

The ephemeral streams (typing, presence) replicate through a `ReplicationClient` of their own,
publishing on per-stream channels (`<prefix>/typing`, `<prefix>/presence`) so the main client of
other workers never sees their lines, and subscribed to the base channel for USER_SYNC, REPLICATE
and positions. The cost: one more pair of Redis connections per worker, and this subscriber also
receives (and drops at once) the base channel's traffic unless `per_stream_channels` is on. Folding
both streams into the worker's main client (add the two streams to its list, route their rows in
its apply callback) removes that cost once `app.py` can take the change.

Hooks for the client API and /sync (see docs/ephemeral.md):
* `sync_tracker.sync_request(user_id, device_id)`: async context around each /sync request;
* `typing.typing_section(room_ids, since)`, `typing.current_token()`;
* `presence_section(user_id, since, upto)`, `presence.current_token()`;
* `typing.set_typing(...)`, `presence.set_presence(...)`, `presence.get_presence(...)`; errors in
  `workers.handlers.placement.forwarding` (OwnerUnavailable -> 503 + Retry-After).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from pubsub.client import ReplicationClient, ReplicationSettings
from pubsub.streams import Stream
from pubsub.tasks import cancel_and_wait
from pubsub.ticks import sleep_to_next_run
from pubsub.types import Row, UpdateFunction
from pubsub.wire import ClearUserSync, UserSync
from workers.config import ConfigError, WorkerConfig
from workers.handlers.caches.lru import SyncCaches
from workers.handlers.ephemeral.presence_service import PresenceService
from workers.handlers.ephemeral.presence_sync import PresenceSyncTracker, new_instance_id
from workers.handlers.ephemeral.typing_service import TypingService
from workers.handlers.notify.notifier import Notifier
from workers.http.internal import InternalApi, InternalError, InternalOps
from workers.http.requests import WorkerRequests
from workers.streams.memory import MemoryPositions, epoch_token
from workers.streams.presence import PRESENCE, PresenceRow, presence_stream
from workers.streams.typing import TYPING, TypingRow, typing_stream

log = logging.getLogger(__name__)
SYNC_ENDS_INTERVAL_S = 1.0
RESEND_DEBOUNCE_S = 0.5


class WorkerParts(Protocol):
    """What the wiring takes from `workers.app.Worker`."""

    config: WorkerConfig
    registry: CollectorRegistry
    notifier: Notifier
    replication: ReplicationClient
    caches: SyncCaches


class _NoRow(NamedTuple):
    pass


class _NoPositions:
    def get_current_token_for_writer(self, instance_name: str) -> int:
        return 0

    def advance(self, instance_name: str, new_id: int) -> None:
        return None

    def get_positions(self) -> dict[str, int]:
        return {}


async def _no_rows(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, Any]]:
    return []


class _Renamed(Collector):
    """Another registry's metrics under a new name prefix (the ephemeral client's `fanout_repl_*`
    would clash with the main client's in the worker's registry)."""

    def __init__(self, source: CollectorRegistry, old: str, new: str) -> None:
        self._source, self._old, self._new = source, old, new

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            family.name = family.name.replace(self._old, self._new, 1)
            family.samples = [
                s._replace(name=s.name.replace(self._old, self._new, 1)) for s in family.samples
            ]
            yield family


def _one_writer(config: WorkerConfig, stream: str) -> str | None:
    writers = config.writers_of(stream)
    if len(writers) > 1:
        raise ConfigError(
            f"stream_writers.{stream}: one writer only (it keeps the state in memory), got {writers}"
        )
    return writers[0] if writers else None


class Ephemeral:
    def __init__(self, worker: WorkerParts) -> None:
        config = self.config = worker.config
        self.worker = worker
        self.name = config.instance_name
        self.instance_id = new_instance_id(self.name)
        self.requests = WorkerRequests(
            config.instance_map,
            config.worker_secret,
            worker.registry,
            positions=self.positions,
            timeout_s=config.worker_request_timeout_s,
        )
        start = epoch_token()
        self.typing = TypingService(
            self.name,
            _one_writer(config, TYPING),
            MemoryPositions(self.name, config.writers_of(TYPING), start),
            self.requests,
            self._wake_rooms,
        )
        self.presence = PresenceService(
            self.name,
            _one_writer(config, PRESENCE),
            MemoryPositions(self.name, config.writers_of(PRESENCE), start),
            self.requests,
            self._wake_users,
            process_timeout_s=config.presence_process_timeout_s,
            offline_grace_s=config.presence_offline_grace_s,
        )
        self.sync_tracker = PresenceSyncTracker(self.instance_id, self._send, config.user_sync_end_delay_s)
        self.fetches = Counter(
            "fanout_ephemeral_catch_up_fetches",
            "Catch-up fetches of in-memory streams from their writer",
            ["stream", "answer"],
            registry=worker.registry,
        )
        streams: list[Stream[Any]] = [
            typing_stream(self.typing.positions, config.writers_of(TYPING), self._counted(TYPING)),
            presence_stream(self.presence.positions, config.writers_of(PRESENCE), self._counted(PRESENCE)),
        ]
        main = worker.replication
        others = {s.name for s in [*main.read_streams, *main.written_streams]}
        streams += [Stream(n, _NoRow, _no_rows, _NoPositions(), ()) for n in sorted(others)]
        # Without a typing or presence writer there is nothing to replicate: no second client, so a
        # worker does not pay for hearing the base channel twice.
        self.client: ReplicationClient | None = None
        if config.writers_of(TYPING) or config.writers_of(PRESENCE):
            self.client = ReplicationClient(
                ReplicationSettings.from_config(config, per_stream_channels=True),
                streams,
                apply=self._apply,
                read=[TYPING, PRESENCE],
            )
            worker.registry.register(
                _Renamed(self.client.metrics.registry, "fanout_repl_", "fanout_ephemeral_repl_")
            )
            self.client.add_position_listener(self._position_moved)
            self.client.add_user_sync_listener(self._user_sync_heard)
        self.typing.publish = self._publisher(TYPING)
        self.presence.publish = self._publisher(PRESENCE)
        self.internal = InternalApi(
            config.worker_secret,
            InternalOps(
                self.name,
                self.instance_id,
                self._stream_rows,
                self._set_typing_here,
                self._typing_view,
                self._set_presence_here,
                self._get_presence_here,
                self.wait_for_positions,
            ),
            worker.registry,
        )
        self._pending: dict[str, tuple[set[str], set[str]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._resend: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[None]] = set()

    def mount(self, application: web.Application) -> None:
        """Add the internal routes to `application` and tie start and stop to its life (call
        before the application starts)."""
        application.add_routes(self.internal.routes())
        application.on_startup.append(self.on_startup)
        application.on_shutdown.append(self.on_shutdown)

    # -- hooks for /sync ------------------------------------------------------------------------

    def ephemeral_tokens(self) -> tuple[int, int]:
        """The (typing, presence) components of this worker's sync token."""
        return self.typing.current_token(), self.presence.current_token()

    def typing_events(self, room_ids: Iterable[str], since: int | None) -> dict[str, dict[str, Any]]:
        return self.typing.typing_section(room_ids, since)

    async def presence_events(self, user_id: str, since: int | None, upto: int) -> list[dict[str, Any]]:
        return await self.presence_section(user_id, since, upto)

    async def presence_section(
        self, user_id: str, since: int | None, upto: int | None
    ) -> list[dict[str, Any]]:
        """m.presence events for /sync's `presence.events` (see `PresenceService.presence_section`)."""
        return await self.presence.presence_section(user_id, since, upto, self.worker.caches.sharing_a_room)

    # -- lifecycle ------------------------------------------------------------------------------

    async def on_startup(self, _app: web.Application) -> None:
        self.requests.start()
        if self.client is None:
            log.info("ephemeral: no typing or presence writer configured; worker requests only")
            return
        await self.client.start()
        loop = asyncio.get_running_loop()
        if self.typing.is_writer:
            self._tasks.append(loop.create_task(self.typing.expire_forever(), name="typing-expiry"))
        if self.presence.is_writer:
            self._tasks.append(loop.create_task(self.presence.tick_forever(), name="presence-timer"))
        self._tasks.append(loop.create_task(self._sync_timers(), name="user-sync-timers"))
        log.info(
            "ephemeral ready instance=%s instance_id=%s typing_writer=%s presence_writer=%s",
            self.name,
            self.instance_id,
            self.typing.writer,
            self.presence.writer,
        )

    async def on_shutdown(self, _app: web.Application) -> None:
        """CLEAR_USER_SYNC first (the presence writer then times our users out normally), then stop."""
        if self.client is not None:
            await self.sync_tracker.send_clear()
        if self._resend is not None:
            self._resend.cancel()
        await cancel_and_wait(*self._tasks, *self._background)
        if self.client is not None:
            await self.client.stop()
        await self.requests.close()

    async def _sync_timers(self) -> None:
        """Due USER_SYNC ends; starts re-sent after each (re)subscription and as the keep-alive.

        pubsub/client.py has no public "after each (re)subscribe" hook (`_subscribed` is private);
        the transport's public `connects` counter, bumped on every confirmed subscription, is
        polled here instead (a re-send at most one interval late). Re-sending on every REPLICATE
        would make each worker start trigger every sync worker's re-send: a storm in a rolling
        restart. A restarted presence writer is noticed by its stream's reset (`_counted`)."""
        assert self.client is not None
        keepalive_at = time.monotonic() + self.config.presence_keepalive_s
        connects = self.client.transport.connects
        while True:
            await sleep_to_next_run(min(SYNC_ENDS_INTERVAL_S, self.config.presence_keepalive_s))
            await self.sync_tracker.send_due_ends()
            reconnected = self.client.transport.connects != connects
            connects = self.client.transport.connects
            if reconnected or time.monotonic() >= keepalive_at:
                keepalive_at = time.monotonic() + self.config.presence_keepalive_s
                await self.sync_tracker.resend_starts()

    # -- replication ----------------------------------------------------------------------------

    def _publisher(self, stream: str) -> Callable[[Sequence[tuple[int, Any]]], None]:
        def publish(rows: Sequence[tuple[int, Any]]) -> None:
            assert self.client is not None, "a typing or presence writer always has its client"
            self.client.stage_rows(stream, rows)
            self.client.notify(stream)

        return publish

    def _counted(self, stream: str) -> UpdateFunction:
        service = self.typing if stream == TYPING else self.presence

        async def update(
            instance: str, from_token: int, to_token: int, limit: int
        ) -> Sequence[tuple[int, Any]]:
            resets = service.resets
            rows = await service.fetch_updates(instance, from_token, to_token, limit)
            reset = service.resets > resets
            self.fetches.labels(stream, "reset" if reset else "rows").inc()
            if reset and stream == PRESENCE:
                # The presence writer restarted (or we were far behind): tell it who syncs here.
                self._schedule_resend()
            return rows

        return update

    async def _apply(
        self, stream: Stream[Any], instance: str, token: int, rows: Sequence[tuple[int, Row]]
    ) -> None:
        rooms, users = self._pending.setdefault(stream.name, (set(), set()))
        if stream.name == TYPING:
            rooms.update(self.typing.apply(token, [r for _, r in rows if isinstance(r, TypingRow)]))
        elif stream.name == PRESENCE:
            users.update(self.presence.apply(token, [r for _, r in rows if isinstance(r, PresenceRow)]))

    def _position_moved(self, stream: str, instance: str, token: int) -> None:
        rooms, users = self._pending.pop(stream, (set(), set()))
        if rooms or users:
            self.worker.notifier.notify(rooms, users)

    def _wake_rooms(self, rooms: Iterable[str]) -> None:
        self.worker.notifier.notify(rooms, ())

    def _wake_users(self, users: Iterable[str]) -> None:
        self.worker.notifier.notify((), users)

    async def _send(self, command: UserSync | ClearUserSync) -> None:
        if self.client is not None:  # no presence writer configured: nobody to tell
            await self.client.send_user_sync(command)

    def _user_sync_heard(self, command: UserSync | ClearUserSync) -> None:
        self.presence.on_user_sync(command)

    def _schedule_resend(self) -> None:
        if self._resend is None:  # coalesced: one re-send for a burst of triggers
            self._resend = asyncio.get_running_loop().call_later(RESEND_DEBOUNCE_S, self._resend_starts)

    def _resend_starts(self) -> None:
        self._resend = None
        task = asyncio.get_running_loop().create_task(self.sync_tracker.resend_starts())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- positions (the worker-request header) ----------------------------------------------------

    def _streams(self) -> dict[str, Stream[Any]]:
        out: dict[str, Stream[Any]] = {}
        for client in (self.worker.replication, self.client):
            if client is None:
                continue
            for stream in [*client.read_streams, *client.written_streams]:
                if stream.writers:
                    out[stream.name] = stream
        return out

    def positions(self) -> dict[tuple[str, str], int]:
        """What this worker has seen of every stream, per writer."""
        return {(s.name, w): s.current_token(w) for s in self._streams().values() for w in s.writers}

    async def wait_for_positions(self, positions: Mapping[tuple[str, str], int], within_s: float) -> bool:
        """Until this worker has seen `positions` (unknown streams ignored), at most `within_s`."""
        streams = self._streams()
        deadline = time.monotonic() + within_s
        while True:
            behind = [
                (name, writer)
                for (name, writer), token in positions.items()
                if name in streams and streams[name].current_token(writer) < token
            ]
            if not behind:
                return True
            if time.monotonic() >= deadline:
                log.warning("positions not reached within %.1fs: %s", within_s, behind[:5])
                return False
            await asyncio.sleep(0.02)

    # -- the owner's side of worker requests ------------------------------------------------------

    async def _stream_rows(self, stream: str, from_token: int, to_token: int, limit: int) -> dict[str, Any]:
        if stream == TYPING and self.typing.is_writer:
            return self.typing.stream_rows(from_token, to_token, limit)
        if stream == PRESENCE and self.presence.is_writer:
            return self.presence.stream_rows(from_token, to_token, limit)
        raise InternalError(404, "M_NOT_FOUND", f"{self.name} does not serve stream {stream!r}")

    async def _set_typing_here(self, room_id: str, user_id: str, typing: bool, timeout_ms: int) -> None:
        if not self.typing.is_writer:
            raise InternalError(409, "M_NOT_OWNER", f"{self.name} is not the typing writer")
        await self.typing.set_typing(room_id, user_id, typing, timeout_ms)

    def _typing_view(self, room_id: str) -> dict[str, Any]:
        return {"user_ids": list(self.typing.view.users(room_id)), "token": self.typing.current_token()}

    async def _set_presence_here(self, user_id: str, presence: str, status_msg: str | None) -> None:
        if not self.presence.is_writer:
            raise InternalError(409, "M_NOT_OWNER", f"{self.name} is not the presence writer")
        await self.presence.set_presence(user_id, presence, status_msg)

    async def _get_presence_here(self, user_id: str) -> dict[str, Any]:
        if not self.presence.is_writer:
            raise InternalError(409, "M_NOT_OWNER", f"{self.name} is not the presence writer")
        return await self.presence.get_presence(user_id)
