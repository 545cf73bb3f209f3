"""One worker process's life: start, serve, stop (run by `fanout worker --config FILE`).

Start-up, each phase logged with its duration: connect to PostgreSQL and Redis, migrate, hold the
instance name, load the ID generators, subscribe and announce, catch up (every writer of every
stream heard once, bounded), start the persisters and the background tasks this instance runs,
then serve HTTP. Only then is /health ready. What an instance does comes from its configuration
alone: it persists a stream when listed among its writers (`WorkerConfig.writers_of`), runs the
tasks in `background_tasks`, and serves reads unless `serve_reads` is false (then it applies only
the caches stream's rows and follows every other stream for positions only).

Every batch, replicated or written here, keeps the ordering rule: invalidate the caches, advance
the generator, wake the readers (`workers.assembly.batch_order`). SIGTERM/SIGINT: refuse new
requests (503), drain the writes, hand the rooms on, let requests in flight end (at most
`SHUTDOWN_GRACE_S`), announce, close, all within `shutdown_timeout_s` (`workers.process.shutdown`).

Each start-up phase has its undo in `stop()`, which runs whatever started (also after a failed
start), and the two read best side by side; what a phase does lives in its own module.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry

from idgen import InstanceMap, MultiWriterIdGenerator, SequenceReads
from pubsub.client import ReplicationClient, ReplicationSettings
from pubsub.streams import Stream
from workers.assembly.batch_order import BatchOrder
from workers.assembly.client_app import Served, client_application, listen
from workers.assembly.ephemeral import Ephemeral
from workers.assembly.generators import load_generators
from workers.assembly.health import WorkerHealth
from workers.assembly.reload import RELEASE_S, LiveWriters
from workers.assembly.stored import StoredStreams
from workers.config import STORED_STREAMS, ConfigError, WorkerConfig
from workers.handlers.caches.applied import AppliedRangesRecorder
from workers.handlers.caches.lru import CacheRows, SyncCaches
from workers.handlers.caches.retention import InvalidationRetentionTask
from workers.handlers.notify.notifier import DeferredWakes, Notifier
from workers.handlers.placement.room_leases import RoomLeases
from workers.handlers.rooms.deletions import RoomDeletions
from workers.handlers.rooms.persist import EventPersister
from workers.handlers.rooms.purge import RoomEnd, RoomGate
from workers.handlers.rooms.rules import RoomViews
from workers.handlers.rooms.stats import RoomStatsTask
from workers.handlers.rooms.versions import RoomVersions
from workers.handlers.rooms.writes import RoomWrites
from workers.handlers.stored.federation_sender import FederationSenderStandIn
from workers.handlers.sync.filter import PATTERN_CACHE
from workers.handlers.sync.handler import SyncHandler, SyncObservers
from workers.handlers.sync.messages import Messages
from workers.handlers.sync.recent_events import RecentEvents, StoredWitness
from workers.http.auth import token_loader
from workers.http.federation_client import FederationClient
from workers.http.health import CacheCollector, CacheStats, ReadinessCollector
from workers.http.in_flight import InFlight
from workers.http.rate_limits import RateLimiter, RateLimitSettings, limiter_client
from workers.process import event_loop
from workers.process.connect import connect_database, migrate, wait_for_redis
from workers.process.connection_budget import check_server
from workers.process.gc_tuning import tune_gc
from workers.process.instance_lease import InstanceLease
from workers.process.metrics import WorkerMetrics
from workers.process.position_hints import discard_hints_ahead
from workers.process.previous_release import PreviousRelease
from workers.process.reachability import PostgresProbe
from workers.process.shutdown import ShutdownOutcome, Step, run_steps
from workers.process.startup_retry import where
from workers.storage import events as event_store
from workers.storage import pooled
from workers.streams.caches import CACHES, caches_stream
from workers.streams.device_lists import DEVICE_LISTS
from workers.streams.events import BACKFILL, EVENTS, backfill_stream, events_stream
from workers.streams.to_device import TO_DEVICE

log = logging.getLogger(__name__)
#: How long a stopping persister tries to release its rooms (PostgreSQL may be unreachable).
CATCH_UP_INTERVALS = 10
#: One shutdown step's bound (the whole has `shutdown_timeout_s`).
SHUTDOWN_STEP_S = 10.0
#: At SIGTERM, how long requests in flight may run on before they are ended with a 503.
SHUTDOWN_GRACE_S = 2.0


class Worker:
    """A worker's parts and their lifecycle; `start()` then `stop()` (or `run()` for both)."""

    def __init__(self, config: WorkerConfig, *, drop_filter: Any = None) -> None:
        self.config = config
        self.name = config.instance_name
        self.registry = CollectorRegistry()
        self.notifier = Notifier()
        self._drop_filter = drop_filter
        self._ready = False
        self._accepting = True
        self._stopping = False
        self.served: Served | None = None
        self.in_flight = InFlight()
        self.http_port = config.http_port
        self.persister: EventPersister | None = None
        self.backfill_persister: EventPersister | None = None
        self.room_stats: RoomStatsTask | None = None
        self.retention: InvalidationRetentionTask | None = None
        self.federation_sender: FederationSenderStandIn | None = None
        self.applied: AppliedRangesRecorder | None = None
        self.generators: dict[str, MultiWriterIdGenerator] = {}
        self.lease: InstanceLease | None = None
        self.room_leases: RoomLeases | None = None
        self.cache_rows: CacheRows | None = None
        self.previous_release: PreviousRelease | None = None
        self._postgres_probe: PostgresProbe | None = None
        self.rate_limits: RateLimiter | None = None
        self.messages: Messages | None = None
        self.live_writers = LiveWriters(self)
        #: Set when this process lost its instance name: it must stop (and exit 1).
        self.lease_lost = asyncio.Event()
        self.metrics = WorkerMetrics(self.registry, lambda: self.notifier.waiting)
        self.status = WorkerHealth(self)
        self.health, self.readiness = self.status.health, self.status.readiness
        self.registry.register(ReadinessCollector(self.readiness))
        self.registry.register(CacheCollector(self._all_caches))

    # -- start-up ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        yield
        log.info("phase=%s took=%.3fs instance=%s", name, time.monotonic() - started, self.name)

    async def start(self) -> None:
        """Start every part in order; on failure, whatever started is stopped by `stop()`.

        Postgres and Redis are retried for `startup_retry_s` (then `Unreachable`); a configuration
        that names no writer of the events stream raises `ConfigError` before anything starts."""
        config = self.config
        if not self.config.writers_of(EVENTS):
            raise ConfigError("stream_writers names no writer of the 'events' stream")
        with self._phase("connect_database"):
            self.pool, self.db_timer = await connect_database(config, self.registry)
        with self._phase("connect_redis"):
            await wait_for_redis(config)
        with self._phase("migrate"):
            await migrate(config, self.pool, self.db_timer)
        with self._phase("hold_instance_name"):
            taking = time.perf_counter()
            self.lease = await InstanceLease.acquire(
                config.session_database_url, config.channel_prefix, self.name, config.instance_lease_s,
                self._lost_instance_name, retake_s=config.startup_retry_s,
            )  # fmt: skip
            taken = time.perf_counter() - taking
            self.db_timer.observe_held("workers.process.instance_lease.InstanceLease.acquire", taken)
            self.lease.timed = self.db_timer.observe_held
        if config.database_pooler == "none":  # behind PgBouncer the pool counts against its pool
            await check_server(self.pool, config.db_pool_size, where(config.database_url))
        with self._phase("load_id_generators"):
            self.instance_map = InstanceMap(self.pool)
            await self.instance_map.get_id(self.name)
            reads = SequenceReads(self.pool)
            self.generators = await load_generators(self.pool, config, reads)
            self.stored = await StoredStreams.load(
                self.pool,
                config,
                lambda stream: self.config.writers_of(stream),
                FederationClient(config.remote_servers).user_devices,
                reads,
            )
            self.generators.update(self.stored.generators)
        self.caches = SyncCaches(
            pooled(self.pool, event_store.user_rooms),
            pooled(self.pool, event_store.joined_members),
            pooled(self.pool, event_store.current_state),
            pooled(self.pool, event_store.visibility_changes),
            config.cache_max_entries,
            access_token=token_loader(self.pool),  # every worker applies the caches stream's rows
            access_token_entries=config.access_token_cache_entries,
            applies_events=config.serve_reads,
        )
        self.room_versions = RoomVersions(self.pool, config.cache_max_entries)
        self.sync = SyncHandler(
            self.pool, self.caches, self.notifier, self.generators, self.instance_map,
            room_versions=self.room_versions,
            recent=RecentEvents(await self.generators[EVENTS].get_max_allocated_token()),
            observers=SyncObservers(
                self.metrics.sync_wake.observe, self.metrics.persist_to_visible.observe,
                self.metrics.tokens_clamped.inc, self.metrics.behind_timeouts.inc,
                self.metrics.sync_answered,
            ),
        )  # fmt: skip
        self.room_views = RoomViews(self.pool, config.cache_max_entries)
        self.order = BatchOrder(
            self,
            DeferredWakes(
                self.notifier, lambda: self.generators[EVENTS].get_current_token_for_writer(self.name)
            ),
        )
        events = events_stream(self.pool, self.generators[EVENTS], self.config.writers_of(EVENTS))
        if config.serve_reads:
            notifier, stored = self.notifier, self.stored
            events.witness = StoredWitness(
                self.sync.bodies,
                notifier.watching,
                lambda rooms: stored.one_time_keys.counts_ahead(notifier.devices_on(rooms)),
            )
        streams: list[Stream[Any]] = [
            events,
            backfill_stream(self.pool, self.generators[BACKFILL], self.config.writers_of(BACKFILL)),
            caches_stream(self.pool, self.generators[CACHES], self.config.writers_of(CACHES)),
            *self.stored.streams(),
        ]
        # What this run applies of the caches stream, for the audit's reconciliation of what readers
        # applied; a worker that serves no reads applies no invalidation that matters and keeps none.
        if config.serve_reads:
            self.applied = AppliedRangesRecorder(self.pool, self.name, CACHES)
            for writer in self.config.writers_of(CACHES):
                self.applied.begin(writer, self.generators[CACHES].get_current_token_for_writer(writer))
        with self._phase("subscribe"):
            self.replication = ReplicationClient(
                ReplicationSettings.from_config(config),
                streams,
                apply=self.order.apply,
                positions_only=[] if config.serve_reads else [s.name for s in streams if s.name != CACHES],
                drop_filter=self._drop_filter,
                registry=self.registry,
            )
            for generator in self.generators.values():  # publish as soon as a write's IDs finish
                generator.on_finished = self.replication.notify
                generator.timed = self.db_timer.observe_held
            self.replication.add_position_listener(self.order.position_moved)
            self.replication.add_foreign_writer_listener(self.order.foreign_writer)
            self.stored.bind(
                self.replication, self.caches, self.notifier, self.replication.handler.is_connected
            )
            self.sync.stored = self.stored.sections
            # The caches-stream rows this worker writes beside its changes (a device_lists writer,
            # a room's end on a persister), applied here and published in the ordering rule's order.
            if self.name in self.config.writers_of(CACHES):
                self.cache_rows = CacheRows(
                    self.name, self.generators[CACHES], lambda rows: self.order.committed([], [], rows),
                    self.order.cache_row_uncertain, lambda rows: self.order.finished([], [], rows),
                )  # fmt: skip
            if self.name in self.config.writers_of(DEVICE_LISTS):
                self.stored.device_lists.cache_rows = self.stored.one_time_keys.cache_rows = self.cache_rows
            await self.replication.start()
        with self._phase("check_position_hints"):
            hints = await self.replication.transport.hint_client()
            await discard_hints_ahead(hints, config.channel_prefix, self.generators)
        with self._phase("catch_up"):
            within_s = config.position_announce_interval_s * CATCH_UP_INTERVALS
            heard = (EVENTS, BACKFILL, CACHES, *STORED_STREAMS)
            unheard = await self.replication.wait_heard({n: config.writers_of(n) for n in heard}, within_s)
            if unheard:
                log.warning(
                    "start-up: not heard from %s within %.1fs; serving anyway", sorted(unheard), within_s
                )
        if self.applied is not None:
            self.applied.start()
        with self._phase("check_previous_release"):  # before any room is taken
            previous = self.previous_release = PreviousRelease(self.pool, f"{config.channel_prefix}/")
            keys = self.stored.one_time_keys
            keys.mixed_release = lambda: previous.live
            await previous.check()
            previous.start()
            self.stored.follow(self.lease.fence if self.lease else None, lambda: previous.live)
        if config.writes(EVENTS):
            with self._phase("start_persisters"):
                self.room_leases = RoomLeases(
                    self.pool, self.name, f"{config.channel_prefix}/", self.generators[EVENTS],
                    self.notifier, lambda writer: self.replication.handler.is_connected(EVENTS, writer),
                    config.writer_wait_s,
                )  # fmt: skip
                self.room_leases.hashed_writer = functools.partial(
                    previous.hashed_writer, writers=self.config.writers_of(EVENTS)
                )
                self.room_leases.on_taken = self.room_views.forget_room  # its state moved on elsewhere
                self.persister = self._persister(EVENTS, self.generators[CACHES])
                self.backfill_persister = self._persister(BACKFILL, None)
        if "room_stats" in config.background_tasks:
            with self._phase("start_background"):
                self.room_stats = RoomStatsTask(self.pool, self.generators[EVENTS], self.notifier)
                await self.room_stats.load()
                self.room_stats.start()
        if "prune_invalidations" in config.background_tasks:
            self.retention = InvalidationRetentionTask(self.pool, config.invalidation_retention_days)
            self.retention.start()
        if "federation_sender" in config.background_tasks:
            queues = (self.stored.generators[DEVICE_LISTS], self.stored.generators[TO_DEVICE])
            self.federation_sender = FederationSenderStandIn(
                self.pool, self.registry, lambda: [generator.get_positions() for generator in queues]
            )
            self.federation_sender.start()
        self._postgres_probe = PostgresProbe(self.pool, config.position_announce_interval_s)
        previous.on_outcome = self._postgres_probe.observe
        self._postgres_probe.start()
        with self._phase("serve_http"):
            await self._serve()
        tune_gc()
        self._ready = True
        log.info(
            "ready instance=%s http=%s:%d event_loop=%s",
            self.name, config.http_host, self.http_port, event_loop.name(),
        )  # fmt: skip

    def _persister(self, stream: str, caches: MultiWriterIdGenerator | None) -> EventPersister:
        """A started persister of `stream` (events, or backfill's negative orderings)."""
        persister = EventPersister(
            self.pool, self.name, self.generators[stream], caches,
            on_committed=self.order.committed, on_finished=self.order.finished, backfill=stream == BACKFILL,
            max_in_flight=self.config.persist_batches_in_flight, room_versions=self.room_versions,
            on_uncertain=self.order.uncertain, fence=self.lease.fence if self.lease else None,
            room_leases=self.room_leases,
        )  # fmt: skip
        persister.start()
        return persister

    async def _room_writes(self) -> RoomWrites:
        """The room writes, with the room's end (purge, last member gone, deletions) where this
        worker persists events and writes the caches stream."""
        config, gate = self.config, RoomGate()
        end, deletions = None, None
        if self.persister is not None and self.cache_rows is not None:
            end = RoomEnd(self.pool, config.server_name, self.persister, self.cache_rows, gate)
            deletions = RoomDeletions(self.pool, self.name, end)
            await deletions.interrupted()
        previous = self.previous_release
        return RoomWrites(
            self.name, config.writers_of(EVENTS), self.pool, self.persister, self.backfill_persister,
            self.room_views, self.generators[EVENTS], self.notifier, config.server_name,
            forwarder=self.ephemeral.requests, leases=self.room_leases, end=end, deletions=deletions,
            hears=lambda writer: self.replication.handler.is_connected(EVENTS, writer), gate=gate,
            owner_wait_s=config.writer_wait_s, by_hash=None if previous is None else lambda: previous.live,
        )  # fmt: skip

    async def _serve(self) -> None:
        config = self.config
        self.ephemeral = Ephemeral(self)  # typing, presence, worker requests; mounted below
        self.room_writes = await self._room_writes()
        # A room's end (purge, last local member gone) drops what every worker keeps of it.
        self.caches.room_ended += [
            self.room_views.forget_room, self.sync.bodies.forget_room, self.room_versions.cache.invalidate,
        ]  # fmt: skip
        if config.serve_reads:
            self.messages = Messages(
                self.pool, self.caches, self.sync.decode, self.sync.current_token,
                self.room_versions,
            )  # fmt: skip
        self.rate_limits = RateLimiter(
            limiter_client(config), config.channel_prefix, RateLimitSettings.from_config(config), self.pool,
            self.registry,
        )  # fmt: skip
        self.sync.ephemeral = self.ephemeral
        self.stored.set_forwarder(self.ephemeral.requests, config.writer_wait_s)
        app, caches = client_application(
            self, self.ephemeral, self.room_writes, self.messages, self.rate_limits, self.health
        )
        self.served = await listen(app, caches, self, self.health)
        self.http_port = self.served.port

    def _all_caches(self) -> list[CacheStats]:
        """For the scrape: every in-process cache, as far as start-up has built them."""
        if not hasattr(self, "room_views"):  # built after the others below
            return []
        return [
            *self.caches.all(), self.room_views.rooms, self.room_views.memberships,
            self.room_versions.cache, self.instance_map, self.sync.bodies, self.sync.recent,
            self.sync.token_cache, PATTERN_CACHE, *self.stored.changes.values(),
            *(self.served.caches if self.served is not None else []),
        ]  # fmt: skip

    @property
    def started(self) -> bool:
        return self._ready

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def postgres_probe(self) -> PostgresProbe | None:
        return self._postgres_probe

    def _lost_instance_name(self) -> None:
        """Another process may now take our name: refuse requests at once, then let the owner stop us."""
        self._accepting = False
        self.lease_lost.set()

    async def stop(self) -> ShutdownOutcome:
        """Graceful: refuse new requests, drain writes, announce, close; within
        `shutdown_timeout_s`, whatever PostgreSQL and Redis do (`workers.process.shutdown`): what it could
        not finish is in the outcome and one log line. Safe to call twice (the second does nothing)."""
        if self._stopping:
            return ShutdownOutcome()
        self._stopping = True
        self._accepting = False
        log.info("shutting down instance=%s", self.name)
        if hasattr(self, "sync"):  # start-up may have failed before the handler existed
            self.sync.closing = True
        self.notifier.notify_all()
        steps: list[Step] = [("stop_reload", self.live_writers.stop)]
        if getattr(self, "room_writes", None) is not None and self.room_writes.deletions is not None:
            steps.append(("finish_room_deletions", self.room_writes.deletions.stop))
        for persister in (self.persister, self.backfill_persister):
            if persister is not None:
                steps.append(("drain_writes", persister.stop))
        if self.room_leases is not None:
            steps.append(("release_rooms", self.live_writers.release_rooms))
        if hasattr(self, "stored"):
            steps.append(("release_user_streams", lambda: self.stored.drain(RELEASE_S)))
        if self.room_stats is not None:
            steps.append(("stop_background", self.room_stats.stop))
        if self.retention is not None:
            steps.append(("stop_retention", self.retention.stop))
        if self.federation_sender is not None:
            steps.append(("stop_federation_sender", self.federation_sender.stop))
        if (served := self.served) is not None:  # while replication runs, so a send in flight sees its event
            steps.append(("end_requests", lambda: self.in_flight.settle(SHUTDOWN_GRACE_S)))
            steps.append(("close_http", served.runner.cleanup))
        if hasattr(self, "replication"):
            steps.append(("announce_and_unsubscribe", self.replication.stop))
        if self.applied is not None:
            steps.append(("record_applied", self.applied.stop))
        if served is not None and served.metrics_runner is not None:
            steps.append(("close_metrics_http", served.metrics_runner.cleanup))
        if self.rate_limits is not None:
            steps.append(("close_rate_limits", self.rate_limits.close))
        if self._postgres_probe is not None:
            steps.append(("stop_probe", self._postgres_probe.stop))
        if self.previous_release is not None:
            steps.append(("stop_previous_release_check", self.previous_release.stop))
        steps.append(
            ("close_generators", lambda: asyncio.gather(*(g.close() for g in self.generators.values())))
        )
        if hasattr(self, "pool"):
            steps.append(("close_database", self.pool.close))
        if self.lease is not None:
            steps.append(("release_instance_name", self.lease.release))
        outcome = await run_steps(
            [(name, self._timed(name, step)) for name, step in steps],
            total_s=self.config.shutdown_timeout_s, step_s=SHUTDOWN_STEP_S,
        )  # fmt: skip
        if hasattr(self, "pool") and not outcome.clean:
            self.pool.terminate()  # close what a skipped step left open, without waiting on the server
        if outcome.clean:
            log.info("stopped instance=%s in %.1fs", self.name, outcome.elapsed_s)
        else:
            log.error("stopped instance=%s in %.1fs, not cleanly: %s", self.name, outcome.elapsed_s,
                      outcome.describe())  # fmt: skip
        return outcome

    def _timed(self, name: str, step: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[None]]:
        async def timed() -> None:
            with self._phase(f"shutdown:{name}"):
                await step()

        return timed
