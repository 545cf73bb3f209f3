"""One worker process's life: start, serve, stop (run by `fanout worker --config FILE`).

Start-up, each phase logged with its duration: connect to Postgres, apply migrations, load the ID
generators (eagerly, so a write never waits on a lazy load), subscribe to Redis and announce,
catch up (every writer of every stream heard once, bounded), start the persisters and background
tasks this instance runs, then serve HTTP. Only then is /health ready.

What an instance does comes from the configuration alone: it persists events when it is listed in
`stream_writers.events`, runs the background tasks in `background_tasks`, and serves /sync and room
state unless `serve_reads` is false. A worker that serves no reads applies no other writer's rows
but the caches stream's (it still caches access tokens, and the caches rows end them): it follows
every other stream for positions only (a persister still needs them: the position it announces
when idle is the highest one it has heard of), which saves it the validation and the cache work
of every row the other writers publish.

Order on every replicated batch (the rule that keeps readers from seeing stale data): the apply
callback invalidates caches, pubsub advances the generator, then the position listener wakes
readers. The persister keeps the same order for its own writes. Those callbacks are
`workers.batch_order.BatchOrder`.

SIGTERM/SIGINT: stop taking requests (503), finish queued writes, let requests in flight end (at
most `SHUTDOWN_GRACE_S`, then they answer 503), announce final positions, close, exit 0.

Over 400 lines, one class: each start-up phase has its undo in `stop()`, which runs whatever
started (also after a failed start), and the two read best side by side. What a phase does lives
in its own module (handlers, storage, streams, http); this module only orders them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import redis.exceptions
from aiohttp import web
from prometheus_client import CollectorRegistry

from idgen import InstanceMap, MultiWriterIdGenerator
from pubsub.client import ReplicationClient, ReplicationSettings
from pubsub.streams import Stream
from workers import event_loop
from workers.batch_order import BatchOrder
from workers.config import ConfigError, WorkerConfig
from workers.connection_budget import check_server
from workers.ephemeral import install_ephemeral
from workers.gc_tuning import tune_gc
from workers.handlers.applied import AppliedRangesRecorder
from workers.handlers.caches import CacheRows, SyncCaches
from workers.handlers.federation_sender import FederationSenderStandIn
from workers.handlers.invalidation_retention import InvalidationRetentionTask
from workers.handlers.messages import Messages
from workers.handlers.notifier import DeferredWakes, Notifier
from workers.handlers.persist import EventPersister
from workers.handlers.recent_events import RecentEvents
from workers.handlers.room_deletions import RoomDeletions
from workers.handlers.room_leases import RoomLeases
from workers.handlers.room_purge import RoomEnd
from workers.handlers.room_stats import RoomStatsTask
from workers.handlers.room_versions import RoomVersions
from workers.handlers.room_writes import RoomWrites
from workers.handlers.rooms import RoomViews
from workers.handlers.sync import SyncHandler, SyncObservers
from workers.handlers.sync_filter import PATTERN_CACHE
from workers.http.accounts import AccountSettings
from workers.http.auth import TOKEN_CACHE, token_loader
from workers.http.client_api import ApiDeps, ClientApi
from workers.http.federation_client import FederationClient
from workers.http.health import CacheCollector, CacheStats, ReadinessCollector, health_routes
from workers.http.in_flight import InFlight
from workers.http.limits import runner_limits
from workers.http.rate_limits import RateLimiter, RateLimitSettings, limiter_client
from workers.http.read_forwarding import ReadRouting
from workers.http.timing import request_timing
from workers.instance_lease import InstanceLease
from workers.position_hints import discard_hints_ahead
from workers.previous_release import PreviousRelease
from workers.reachability import PostgresProbe
from workers.reload import ConfigReload, LiveWriters, writers_of
from workers.startup_retry import connect_with_retry, ping_direct_postgres, ping_redis, where
from workers.storage import connect, create_pool, pooled
from workers.storage import events as event_store
from workers.storage.migrate import apply_migrations
from workers.storage.named_pool import TransactionTimer
from workers.stored import NAMES as STORED_STREAMS
from workers.stored import StoredStreams
from workers.streams.caches import CACHES, caches_stream
from workers.streams.device_lists import DEVICE_LISTS
from workers.streams.events import BACKFILL, EVENTS, backfill_stream, events_stream
from workers.worker_metrics import WorkerMetrics

log = logging.getLogger(__name__)
#: How long a stopping persister tries to release its rooms (PostgreSQL may be unreachable).
ROOM_RELEASE_S = 3.0
CATCH_UP_INTERVALS = 10
SHUTDOWN_STEP_S = 10.0
#: At SIGTERM, how long requests in flight may run on before they are ended with a 503.
SHUTDOWN_GRACE_S = 2.0
#: The events writer's `stream_positions` row may lag its writes by this long: the upsert rides on the
#: next allocation (no round trip of its own per batch, none before the sends are answered).
EVENTS_POSITION_DELAY_S = 0.05
#: What "not reachable yet" looks like at start-up (retried for `startup_retry_s`).
#: The migrations' transaction name (they run in `Worker.start`, a name that would say nothing).
_MIGRATIONS = "workers.storage.migrate.apply_migrations"
_POSTGRES_DOWN = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)
_REDIS_DOWN = (OSError, TimeoutError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


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
        self._runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None
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
        self.previous_release: PreviousRelease | None = None
        self._postgres_probe: PostgresProbe | None = None
        self.rate_limits: RateLimiter | None = None
        self.messages: Messages | None = None
        self._reload: ConfigReload | None = None
        self.live_writers = LiveWriters(self)
        #: Set when this process lost its instance name: it must stop (and exit 1).
        self.lease_lost = asyncio.Event()
        self.metrics = WorkerMetrics(self.registry, lambda: self.notifier.waiting)
        self.registry.register(ReadinessCollector(self.readiness))
        #: The caches of the HTTP routes and the ephemeral streams, once `_serve` has built them.
        self._served_caches: list[CacheStats] = []
        self.registry.register(CacheCollector(self._all_caches))

    # -- start-up ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        yield
        log.info("phase=%s took=%.3fs instance=%s", name, time.monotonic() - started, self.name)

    def writers(self, stream: str) -> list[str]:
        return writers_of(self.config, stream)

    async def start(self) -> None:
        """Start every part in order; on failure, whatever started is stopped by `stop()`.

        Postgres and Redis are retried for `startup_retry_s` (then `Unreachable`); a configuration
        that names no writer of the events stream raises `ConfigError` before anything starts."""
        config = self.config
        if not self.writers(EVENTS):
            raise ConfigError("stream_writers names no writer of the 'events' stream")
        with self._phase("connect_database"):
            self.pool = await connect_with_retry(
                "PostgreSQL", config.database_url,
                lambda: create_pool(
                    config.database_url, config.db_pool_size,
                    transaction_pooler=config.database_pooler == "transaction",
                ),
                config.startup_retry_s, _POSTGRES_DOWN,
            )  # fmt: skip
            self.db_timer = self.pool.timer = TransactionTimer(self.registry, config.db_slow_transaction_s)
            if config.database_direct_url is not None:
                pinging = time.perf_counter()
                await connect_with_retry(
                    "PostgreSQL (database_direct_url)", config.database_direct_url,
                    lambda: ping_direct_postgres(config.session_database_url),
                    config.startup_retry_s, _POSTGRES_DOWN,
                )  # fmt: skip
                self.db_timer.observe_held(
                    "workers.startup_retry.ping_direct_postgres", time.perf_counter() - pinging
                )
        with self._phase("connect_redis"):
            await connect_with_retry(
                "Redis", config.redis_url, lambda: ping_redis(config.redis_url),
                config.startup_retry_s, _REDIS_DOWN,
            )  # fmt: skip
        with self._phase("migrate"):
            if config.database_direct_url is None:
                async with self.pool.acquire(name=_MIGRATIONS) as conn:
                    await apply_migrations(conn)
            else:  # its advisory lock needs one session: never through a transaction pooler
                migrating = time.perf_counter()
                async with connect(config.database_direct_url) as direct:
                    await apply_migrations(direct)
                self.db_timer.observe_held(_MIGRATIONS, time.perf_counter() - migrating)
        with self._phase("hold_instance_name"):
            taking = time.perf_counter()
            self.lease = await InstanceLease.acquire(
                config.session_database_url, config.channel_prefix, self.name, config.instance_lease_s,
                self._lost_instance_name, retake_s=config.startup_retry_s,
            )  # fmt: skip
            taken = time.perf_counter() - taking
            self.db_timer.observe_held("workers.instance_lease.InstanceLease.acquire", taken)
            self.lease.timed = self.db_timer.observe_held
        if config.database_pooler == "none":  # behind PgBouncer the pool counts against its pool
            await check_server(self.pool, config.db_pool_size, where(config.database_url))
        with self._phase("load_id_generators"):
            self.instance_map = InstanceMap(self.pool)
            await self.instance_map.get_id(self.name)
            events_table = [("events", "instance_name", "stream_ordering")]
            self.generators = {
                EVENTS: await MultiWriterIdGenerator.create(
                    self.pool, stream_name=EVENTS, instance_name=self.name, tables=events_table,
                    sequence_name="events_stream_seq", writers=self.writers(EVENTS),
                    position_delay_s=EVENTS_POSITION_DELAY_S,
                ),
                BACKFILL: await MultiWriterIdGenerator.create(
                    self.pool, stream_name=BACKFILL, instance_name=self.name, tables=events_table,
                    sequence_name="events_backfill_stream_seq", writers=self.writers(BACKFILL),
                    positive=False,
                ),
                CACHES: await MultiWriterIdGenerator.create(
                    self.pool, stream_name=CACHES, instance_name=self.name,
                    tables=[("cache_invalidation_stream_by_instance", "instance_name", "stream_id")],
                    sequence_name="cache_invalidation_stream_seq", writers=self.writers(CACHES),
                    track_positions_table=False,
                ),
            }  # fmt: skip
            self.stored = await StoredStreams.load(
                self.pool, config, self.writers, FederationClient(config.remote_servers).user_devices
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
        streams: list[Stream[Any]] = [
            events_stream(self.pool, self.generators[EVENTS], self.writers(EVENTS)),
            backfill_stream(self.pool, self.generators[BACKFILL], self.writers(BACKFILL)),
            caches_stream(self.pool, self.generators[CACHES], self.writers(CACHES)),
            *self.stored.streams(),
        ]
        # What this run applies of the caches stream, for the audit's reconciliation of what readers
        # applied; a worker that serves no reads applies no invalidation that matters and keeps none.
        if config.serve_reads:
            self.applied = AppliedRangesRecorder(self.pool, self.name, CACHES)
            for writer in self.writers(CACHES):
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
            if self.name in self.writers(DEVICE_LISTS):
                self.stored.device_lists.cache_rows = CacheRows(
                    self.name, self.generators[CACHES], lambda rows: self.order.committed([], [], rows),
                    self.order.cache_row_uncertain, lambda rows: self.order.finished([], [], rows),
                )  # fmt: skip
                self.stored.one_time_keys.cache_rows = self.stored.device_lists.cache_rows
            await self.replication.start()
        with self._phase("check_position_hints"):
            hints = await self.replication.transport.hint_client()
            await discard_hints_ahead(hints, config.channel_prefix, self.generators)
        with self._phase("catch_up"):
            await self._wait_caught_up(config.position_announce_interval_s * CATCH_UP_INTERVALS)
        if self.applied is not None:
            self.applied.start()
        with self._phase("check_previous_release"):  # before any room is taken or key count cached
            previous = self.previous_release = PreviousRelease(self.pool, f"{config.channel_prefix}/")
            keys = self.stored.one_time_keys
            keys.mixed_release = lambda: previous.live
            previous.on_change.append(keys.previous_release_changed)
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
                    previous.hashed_writer, writers=self.writers(EVENTS)
                )
                self.room_leases.on_taken = self.room_views.forget_room  # its state moved on elsewhere
                self.persister = EventPersister(
                    self.pool, self.name, self.generators[EVENTS], self.generators[CACHES],
                    on_committed=self.order.committed, on_finished=self.order.finished,
                    max_in_flight=config.persist_batches_in_flight, room_versions=self.room_versions,
                    on_uncertain=self.order.uncertain, fence=self.lease.fence if self.lease else None,
                    room_leases=self.room_leases,
                )  # fmt: skip
                self.backfill_persister = EventPersister(
                    self.pool, self.name, self.generators[BACKFILL], None,
                    on_committed=self.order.committed, on_finished=self.order.finished, backfill=True,
                    room_versions=self.room_versions, on_uncertain=self.order.uncertain,
                    fence=self.lease.fence if self.lease else None, room_leases=self.room_leases,
                )  # fmt: skip
                self.persister.start()
                self.backfill_persister.start()
        if "room_stats" in config.background_tasks:
            with self._phase("start_background"):
                self.room_stats = RoomStatsTask(self.pool, self.generators[EVENTS], self.notifier)
                await self.room_stats.load()
                self.room_stats.start()
        if "prune_invalidations" in config.background_tasks:
            self.retention = InvalidationRetentionTask(self.pool, config.invalidation_retention_days)
            self.retention.start()
        if "federation_sender" in config.background_tasks:
            self.federation_sender = FederationSenderStandIn(self.pool, self.registry)
            self.federation_sender.start()
        self._postgres_probe = PostgresProbe(self.pool, config.position_announce_interval_s)
        self._postgres_probe.start()
        with self._phase("serve_http"):
            await self._serve()
        tune_gc()
        self._ready = True
        log.info(
            "ready instance=%s http=%s:%d event_loop=%s",
            self.name, config.http_host, self.http_port, event_loop.name(),
        )  # fmt: skip

    async def _serve(self) -> None:
        config = self.config
        self.room_writes = RoomWrites(
            self.name, self.writers(EVENTS), self.pool, self.persister, self.backfill_persister,
            self.room_views, self.generators[EVENTS], self.notifier, config.server_name,
        )  # fmt: skip
        # A room's end (purge, last local member gone) drops what every worker keeps of it.
        self.caches.room_ended += [
            self.room_views.forget_room, self.sync.bodies.forget_room, self.room_versions.cache.invalidate,
        ]  # fmt: skip
        if self.persister is not None and self.name in self.writers(CACHES):
            self.room_writes.end = RoomEnd(
                self.pool, config.server_name, self.persister,
                CacheRows(
                    self.name, self.generators[CACHES], lambda rows: self.order.committed([], [], rows),
                    self.order.cache_row_uncertain, lambda rows: self.order.finished([], [], rows),
                ),
                self.room_writes.gate,
            )  # fmt: skip
            self.room_writes.deletions = RoomDeletions(self.pool, self.name, self.room_writes.end)
            await self.room_writes.deletions.interrupted()
        reads = config.serve_reads
        if reads:
            self.messages = Messages(
                self.pool, self.caches, self.writers(EVENTS), self.sync.decode, self.sync.current_token,
                self.room_versions,
            )  # fmt: skip
        self.rate_limits = RateLimiter(
            limiter_client(config), config.channel_prefix, RateLimitSettings.from_config(config), self.pool,
            self.registry,
        )  # fmt: skip
        api = ClientApi(
            ApiDeps(
                pool=self.pool,
                accounts=AccountSettings(
                    config.server_name, config.registration, config.registration_shared_secret
                ),
                writes=self.room_writes,
                sync=self.sync if reads else None,
                messages=self.messages,
                metrics=self.registry,
                health=self.health,
                accepting=lambda: self._accepting,
                account_data=self.stored.account_data,
                device_lists=self.stored.device_lists,
                one_time_keys=self.stored.one_time_keys,
                receipts=self.stored.receipts,
                to_device=self.stored.to_device,
                default_room_version=config.default_room_version,
                federation_secret=config.worker_secret,
                rate_limits=self.rate_limits,
                reads=ReadRouting(self.name, reads, config.read_workers, config.worker_request_timeout_s),
            )
        )
        app = api.application()
        if self.caches.access_tokens is not None:
            app[TOKEN_CACHE] = self.caches.access_tokens
        app.middlewares.insert(0, request_timing(self.registry))
        app.middlewares.insert(0, self.in_flight.middleware)
        self.ephemeral = install_ephemeral(app, self)  # typing, presence, worker requests
        filters = api.sync_routes.filters
        self._served_caches += [filters.uploaded, filters.inline]
        self._served_caches.append(self.ephemeral.presence.view.changes)
        self.room_writes.forwarder = self.ephemeral.requests
        self.room_writes.owner_wait_s = config.writer_wait_s
        self.room_writes.leases = self.room_leases
        if (previous := self.previous_release) is not None:
            self.room_writes.placement.by_hash = lambda: previous.live
        if api.deps.reads is not None:  # reads relayed by worker request, caught up to the relayer
            api.deps.reads.requests = self.ephemeral.requests
            api.deps.reads.wait_for_positions = self.ephemeral.wait_for_positions
        self.room_writes.hears = lambda writer: self.replication.handler.is_connected(EVENTS, writer)
        self.sync.ephemeral = self.ephemeral
        api.deps.ephemeral.typing = self.ephemeral.typing
        api.deps.ephemeral.presence = self.ephemeral.presence
        api.deps.ephemeral.sync_tracker = self.ephemeral.sync_tracker if self.config.serve_reads else None
        app.add_routes(self.ephemeral.internal.room_routes(self.room_writes))
        app.add_routes(self.ephemeral.internal.stream_write_routes(self.stored.writes))
        self.stored.set_forwarder(self.ephemeral.requests, config.writer_wait_s)
        limits = runner_limits(
            self.registry, self.config.http_max_line_bytes, self.config.http_max_header_bytes
        )
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0, **limits)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.http_host, self.config.http_port, backlog=1024)
        await site.start()
        if self.config.metrics_port is not None:
            metrics_app = web.Application()
            metrics_app.add_routes(health_routes(self.health, self.registry))
            self._metrics_runner = web.AppRunner(metrics_app, access_log=None)
            await self._metrics_runner.setup()
            await web.TCPSite(self._metrics_runner, self.config.http_host, self.config.metrics_port).start()
        if self.config.http_port == 0 and site._server is not None:
            sockets = getattr(site._server, "sockets", None) or []
            if sockets:
                self.http_port = sockets[0].getsockname()[1]

    async def _wait_caught_up(self, limit_s: float) -> None:
        """Until every writer of every stream has been heard on this connection (bounded)."""
        deadline = time.monotonic() + limit_s
        pending = self._unheard()
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            pending = self._unheard()
        if pending:
            log.warning("start-up: not heard from %s within %.1fs; serving anyway", sorted(pending), limit_s)

    def _unheard(self) -> set[tuple[str, str]]:
        handler = self.replication.handler
        return {
            (stream, writer)
            for stream in (EVENTS, BACKFILL, CACHES, *STORED_STREAMS)
            for writer in self.writers(stream)
            if writer != self.name and not handler.is_connected(stream, writer)
        }

    # -- configuration reload (SIGHUP) ----------------------------------------------------------

    def reload(self, path: str) -> None:
        """Read the configuration file again and apply what changes online (`workers.reload`)."""
        if not self._ready or self._stopping:
            log.warning(
                "config reload ignored: the worker is %s", "stopping" if self._stopping else "starting"
            )
            return
        if self._reload is None:
            self._reload = ConfigReload(path, self.config, self.registry)
        plan = self._reload.read()
        if plan is not None:
            self.live_writers.apply(plan)

    # -- health and shutdown -------------------------------------------------------------------

    def _all_caches(self) -> list[CacheStats]:
        """For the scrape: every in-process cache, as far as start-up has built them."""
        if not hasattr(self, "room_views"):  # built after the others below
            return []
        return [
            *self.caches.all(), self.room_views.rooms, self.room_views.memberships,
            self.room_versions.cache, self.instance_map, self.sync.bodies, self.sync.recent,
            self.sync.token_cache, PATTERN_CACHE, *self.stored.changes.values(), *self._served_caches,
        ]  # fmt: skip

    def health(self) -> tuple[bool, dict[str, Any]]:
        replication = self.replication.health()
        detail: dict[str, Any] = {
            "instance": self.name,
            "accepting": self._accepting,
            "replication": replication,
            "persisted_upto": {s: g.get_current_token() for s, g in self.generators.items()},
        }
        if self.persister is not None:
            detail["persister"] = {"events": self.persister.events, "batches": self.persister.batches,
                                   "queued": self.persister.queued,
                                   "batches_in_flight": self.persister.batches_in_flight}  # fmt: skip
        if self.room_stats is not None:
            detail["room_stats"] = {
                "position": self.room_stats.position,
                "processed": self.room_stats.processed,
            }
        ready, degraded, reasons, degraded_reasons = self.readiness()
        detail.update(reasons=reasons, degraded=degraded, degraded_reasons=degraded_reasons)
        return ready, detail

    def readiness(self) -> tuple[bool, bool, list[str], list[str]]:
        """(ready, degraded, why not ready, why degraded), from in-memory state only (no metrics,
        no query): what /health/ready and the scrape-time gauges both report."""
        client = self.replication
        now = asyncio.get_running_loop().time()
        silent = client.handler.silent_writers(now, client.silent_after_s)
        replication: dict[str, Any] = {
            "subscribed": client.transport.subscribed.is_set(),
            "silent_writers": [{"stream": s, "instance": w, "quiet_s": round(q, 3)} for s, w, q in silent],
            "streams": client.handler.stream_status(now),
        }
        reasons = self._unready_reasons(replication)
        degraded_reasons = [
            f"writer {w['instance']} of {w['stream']} silent for {w['quiet_s']}s"
            for w in replication["silent_writers"]
        ]
        return not reasons, bool(silent), reasons, degraded_reasons

    def _unready_reasons(self, replication: dict[str, Any]) -> list[str]:
        """Why this worker is not ready (empty: ready). Silent writers are never a reason."""
        reasons = []
        if not self._ready:
            reasons.append("starting")
        if not self._accepting:
            reasons.append("stopping" if not self.lease_lost.is_set() else "lost its instance name")
        if not replication["subscribed"]:
            reasons.append("Redis: not subscribed")
        if self._postgres_probe is not None and self._postgres_probe.error is not None:
            reasons.append(f"PostgreSQL: {self._postgres_probe.error}")
        silent = {(w["stream"], w["instance"]) for w in replication["silent_writers"]}
        for stream, writers in replication["streams"].items():
            for writer, state in writers.items():
                announced = state["announced"]
                if (stream, writer) in silent or announced is None or state["position"] >= announced:
                    continue
                reasons.append(f"catching up: {stream} from {writer} at {state['position']} of {announced}")
        return reasons

    def _lost_instance_name(self) -> None:
        """Another process may now take our name: refuse requests at once, then let the owner stop us."""
        self._accepting = False
        self.lease_lost.set()

    async def stop(self) -> None:
        """Graceful: refuse new requests, drain writes, announce, close. Safe to call twice."""
        if self._stopping:
            return
        self._stopping = True
        self._accepting = False
        log.info("shutting down instance=%s", self.name)
        if hasattr(self, "sync"):  # start-up may have failed before the handler existed
            self.sync.closing = True
        self.notifier.notify_all()
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [("stop_reload", self.live_writers.stop)]
        if getattr(self, "room_writes", None) is not None and self.room_writes.deletions is not None:
            steps.append(("finish_room_deletions", self.room_writes.deletions.stop))
        for persister in (self.persister, self.backfill_persister):
            if persister is not None:
                steps.append(("drain_writes", persister.stop))
        if self.room_leases is not None:
            steps.append(("release_rooms", self.release_rooms))
        if hasattr(self, "stored"):
            steps.append(("release_user_streams", self._release_stored))
        if self.room_stats is not None:
            steps.append(("stop_background", self.room_stats.stop))
        if self.retention is not None:
            steps.append(("stop_retention", self.retention.stop))
        if self.federation_sender is not None:
            steps.append(("stop_federation_sender", self.federation_sender.stop))
        if self._runner is not None:  # while replication runs, so a send in flight sees its event
            steps.append(("end_requests", lambda: self.in_flight.settle(SHUTDOWN_GRACE_S)))
            steps.append(("close_http", self._runner.cleanup))
        if hasattr(self, "replication"):
            steps.append(("announce_and_unsubscribe", self.replication.stop))
        if self.applied is not None:
            steps.append(("record_applied", self.applied.stop))
        if self._metrics_runner is not None:
            steps.append(("close_metrics_http", self._metrics_runner.cleanup))
        if self.rate_limits is not None:
            steps.append(("close_rate_limits", self.rate_limits.close))
        if self._postgres_probe is not None:
            steps.append(("stop_probe", self._postgres_probe.stop))
        if self.previous_release is not None:
            steps.append(("stop_previous_release_check", self.previous_release.stop))
        steps += [("close_generators", self._close_generators)]
        if hasattr(self, "pool"):
            steps.append(("close_database", self.pool.close))
        if self.lease is not None:
            steps.append(("release_instance_name", self.lease.release))
        for name, step in steps:
            with self._phase(f"shutdown:{name}"):
                try:
                    await asyncio.wait_for(step(), SHUTDOWN_STEP_S)
                except TimeoutError:
                    # Never hang on the way out; say where we were stuck.
                    log.error("shutdown step %s took over %.0fs; skipping it", name, SHUTDOWN_STEP_S)
                    for task in asyncio.all_tasks():
                        log.error("task %r stack=%s", task.get_name(), task.get_stack(limit=8))
        log.info("stopped instance=%s", self.name)

    async def release_rooms(self) -> None:
        """Hand this persister's rooms on, once its writes drained and no commit outcome is left
        unknown (such a batch may still commit: its rooms move only when this lease expires)."""
        assert self.room_leases is not None
        unknown = sum(p.unknown_outcomes for p in (self.persister, self.backfill_persister) if p is not None)
        if unknown:
            log.warning("rooms kept until the instance lease expires: %d batches of unknown outcome", unknown)
            return
        try:
            await asyncio.wait_for(self.room_leases.release_all(), ROOM_RELEASE_S)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
            log.warning("rooms not released (PostgreSQL: %s); they move when the instance lease expires",
                        e or type(e).__name__)  # fmt: skip

    async def _release_stored(self) -> None:
        """Hand the stored streams' users (rooms, for receipts) written here on, once the
        operations running here ended; not released, they move when the instance lease expires."""
        try:
            await self.stored.drain(ROOM_RELEASE_S)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
            log.warning("stored-stream keys not released (PostgreSQL: %s); they move when the instance"
                        " lease expires", e or type(e).__name__)  # fmt: skip

    async def _close_generators(self) -> None:
        for generator in self.generators.values():
            await generator.close()
