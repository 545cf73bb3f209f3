"""A worker's HTTP edge, assembled: the client API with what its routes use, the worker routes,
the middlewares, and the listeners (client port, and the metrics port when configured).

Every route's collaborator is built before the application (the ephemeral services included), so
nothing is filled in afterwards. It reads the worker's parts through `ServedParts` and must not
import `workers.app`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg
from aiohttp import web
from prometheus_client import CollectorRegistry

from workers.assembly.ephemeral import Ephemeral
from workers.assembly.stored import StoredStreams
from workers.config import WorkerConfig
from workers.handlers.caches.lru import SyncCaches
from workers.handlers.rooms.writes import RoomWrites
from workers.handlers.sync.handler import SyncHandler
from workers.handlers.sync.messages import Messages
from workers.http.accounts import AccountSettings
from workers.http.auth import TOKEN_CACHE
from workers.http.client_api import ApiDeps, ClientApi
from workers.http.ephemeral_routes import EphemeralServices
from workers.http.health import CacheStats, health_routes
from workers.http.in_flight import InFlight
from workers.http.limits import runner_limits
from workers.http.rate_limits import RateLimiter
from workers.http.read_forwarding import ReadRouting
from workers.http.timing import request_timing

Health = Callable[[], tuple[bool, dict[str, Any]]]


class ServedParts(Protocol):
    """What the HTTP edge reads of `workers.app.Worker` (built before it)."""

    @property
    def name(self) -> str: ...
    @property
    def config(self) -> WorkerConfig: ...
    @property
    def pool(self) -> asyncpg.Pool: ...
    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def caches(self) -> SyncCaches: ...
    @property
    def sync(self) -> SyncHandler: ...
    @property
    def stored(self) -> StoredStreams: ...
    @property
    def in_flight(self) -> InFlight: ...
    @property
    def accepting(self) -> bool: ...


@dataclass(slots=True)
class Served:
    """The listeners of a worker's HTTP edge: close them with `runner.cleanup()` (and
    `metrics_runner`'s); `port` is the client port bound (the configured one, or the one the OS
    gave for 0); `caches` are the routes' caches the scrape reports."""

    runner: web.AppRunner
    metrics_runner: web.AppRunner | None
    port: int
    caches: list[CacheStats]


def client_application(
    worker: ServedParts,
    ephemeral: Ephemeral,
    room_writes: RoomWrites,
    messages: Messages | None,
    rate_limits: RateLimiter,
    health: Health,
) -> tuple[web.Application, list[CacheStats]]:
    """The client API and the worker routes on one application; the routes' caches."""
    config, reads = worker.config, worker.config.serve_reads
    relay = ReadRouting(worker.name, reads, config.read_workers, config.worker_request_timeout_s)
    relay.requests, relay.wait_for_positions = ephemeral.requests, ephemeral.wait_for_positions
    stored = worker.stored
    api = ClientApi(
        ApiDeps(
            pool=worker.pool,
            accounts=AccountSettings(
                config.server_name, config.registration, config.registration_shared_secret
            ),
            writes=room_writes,
            sync=worker.sync if reads else None,
            messages=messages,
            metrics=worker.registry,
            health=health,
            accepting=lambda: worker.accepting,
            ephemeral=EphemeralServices(
                typing=ephemeral.typing,
                presence=ephemeral.presence,
                sync_tracker=ephemeral.sync_tracker if reads else None,
            ),
            account_data=stored.account_data,
            device_lists=stored.device_lists,
            one_time_keys=stored.one_time_keys,
            receipts=stored.receipts,
            to_device=stored.to_device,
            default_room_version=config.default_room_version,
            federation_secret=config.worker_secret,
            rate_limits=rate_limits,
            reads=relay,
        )
    )
    app = api.application()
    if worker.caches.access_tokens is not None:
        app[TOKEN_CACHE] = worker.caches.access_tokens
    app.middlewares.insert(0, request_timing(worker.registry))
    app.middlewares.insert(0, worker.in_flight.middleware)
    ephemeral.mount(app)
    app.add_routes(ephemeral.internal.room_routes(room_writes))
    app.add_routes(ephemeral.internal.stream_write_routes(stored.writes))
    filters = api.sync_routes.filters
    return app, [filters.uploaded, filters.inline, ephemeral.presence.view.changes]


async def listen(
    app: web.Application, caches: list[CacheStats], worker: ServedParts, health: Health
) -> Served:
    """Serve `app` on the client port, and the health and metrics routes on the metrics port."""
    config = worker.config
    limits = runner_limits(worker.registry, config.http_max_line_bytes, config.http_max_header_bytes)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0, **limits)
    await runner.setup()
    site = web.TCPSite(runner, config.http_host, config.http_port, backlog=1024)
    await site.start()
    metrics_runner = None
    if config.metrics_port is not None:
        metrics_app = web.Application()
        metrics_app.add_routes(health_routes(health, worker.registry))
        metrics_runner = web.AppRunner(metrics_app, access_log=None)
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, config.http_host, config.metrics_port).start()
    port = config.http_port
    sockets = getattr(site._server, "sockets", None) or []
    if port == 0 and sockets:
        port = sockets[0].getsockname()[1]
    return Served(runner, metrics_runner, port, caches)
