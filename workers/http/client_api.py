"""The client HTTP API of a worker: the Matrix client-server API subset the cluster serves
(docs/api.md lists every endpoint: accounts, rooms, sync, typing and presence), Synapse's
shared-secret registration, our admin paths, and
health and metrics.

Any worker serves any of these: writes reach a room's persister by worker request
(`workers.handlers.rooms.writes`), reads answer from this worker's replicated view. Errors are
the spec's `{"errcode": "M_...", "error": "..."}`; an unknown path or method gets M_UNRECOGNIZED,
an unexpected failure a 500 M_UNKNOWN (logged with its traceback, the one case that is). CORS
headers go on every answer, so browser clients work.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiohttp import web
from prometheus_client import CollectorRegistry

from workers.handlers.rooms.writes import RoomWrites
from workers.handlers.stored.account_data import AccountData
from workers.handlers.stored.device_lists import DeviceLists
from workers.handlers.stored.one_time_keys import OneTimeKeys
from workers.handlers.stored.receipts import Receipts
from workers.handlers.stored.to_device import ToDeviceInbox
from workers.handlers.sync.handler import SyncHandler
from workers.handlers.sync.messages import Messages
from workers.http.account_data import AccountDataRoutes
from workers.http.accounts import Accounts, AccountSettings
from workers.http.admin import AdminRoutes
from workers.http.auth import requester
from workers.http.devices import DeviceRoutes
from workers.http.ephemeral_routes import EphemeralRoutes, EphemeralServices
from workers.http.errors import ApiError, api_error_for, unavailable
from workers.http.federation import FederationStandIn
from workers.http.health import health_routes
from workers.http.keys import KeyRoutes
from workers.http.rate_limits import RateLimiter
from workers.http.read_forwarding import ReadRouting
from workers.http.room_markers import RoomMarkerRoutes
from workers.http.rooms import RoomRoutes
from workers.http.sync import SyncRoutes
from workers.model import DEFAULT_ROOM_VERSION, SUPPORTED_ROOM_VERSIONS

log = logging.getLogger(__name__)
CLIENT = "/_matrix/client/v3"
#: The spec versions whose endpoints we serve as they define them.
SPEC_VERSIONS = [
    "r0.6.1",
    "v1.1",
    "v1.2",
    "v1.3",
    "v1.4",
    "v1.5",
    "v1.6",
    "v1.7",
    "v1.8",
    "v1.9",
    "v1.10",
    "v1.11",
]
CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, HEAD, POST, PUT, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "X-Requested-With, Content-Type, Authorization, Date",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class ApiDeps:
    """What the routes use; `sync`/`messages` are None on workers that serve no reads."""

    pool: asyncpg.Pool
    accounts: AccountSettings
    writes: RoomWrites
    sync: SyncHandler | None
    messages: Messages | None
    metrics: CollectorRegistry
    health: Callable[[], tuple[bool, dict[str, Any]]]
    accepting: Callable[[], bool]
    #: Typing and presence, filled in once the worker has built them.
    ephemeral: EphemeralServices = field(default_factory=EphemeralServices)
    #: The stored user streams (None in tests that build only the routes).
    account_data: AccountData | None = None
    device_lists: DeviceLists | None = None
    one_time_keys: OneTimeKeys | None = None
    receipts: Receipts | None = None
    to_device: ToDeviceInbox | None = None
    default_room_version: str = DEFAULT_ROOM_VERSION
    #: What the federation invite stand-in takes instead of a signature (None: refused).
    federation_secret: str | None = None
    #: The cluster-wide rate limits (None: unlimited); its middleware guards the room routes.
    rate_limits: RateLimiter | None = None
    #: Relays reads when this worker serves none (None in tests that build only the routes).
    reads: ReadRouting | None = None


class ClientApi:
    def __init__(self, deps: ApiDeps) -> None:
        self.deps = deps
        #: /sync and its filters (the worker's scrape reads the filter caches).
        self.sync_routes = SyncRoutes(deps.pool, deps.sync, deps.ephemeral, deps.reads)

    def application(self) -> web.Application:
        deps = self.deps
        limits = [] if deps.rate_limits is None else [deps.rate_limits.middleware()]
        app = web.Application(middlewares=[self._errors, *limits], client_max_size=1 << 20)
        app.add_routes(
            [
                web.get("/_matrix/client/versions", self.versions),
                web.get("/.well-known/matrix/client", self.well_known),
                web.get(f"{CLIENT}/capabilities", self.capabilities),
                web.get(f"{CLIENT}/pushrules/", self.push_rules),
                *Accounts(deps.pool, deps.accounts, deps.device_lists, deps.rate_limits).routes(),
                *RoomRoutes(
                    deps.pool, deps.writes, deps.sync, deps.messages, deps.default_room_version, deps.reads
                ).routes(),
                *self.sync_routes.routes(),
                *EphemeralRoutes(deps.pool, deps.ephemeral).routes(),
                *KeyRoutes(
                    deps.pool, deps.accounts.server_name, deps.device_lists, deps.one_time_keys
                ).routes(),
                *self._stored_routes(),
                *AdminRoutes(deps.pool, deps.writes).routes(),
                *FederationStandIn(deps.writes, deps.federation_secret).routes(),
                *health_routes(deps.health, deps.metrics),
            ]
        )
        return app

    def _stored_routes(self) -> list[web.RouteDef]:
        deps = self.deps
        routes: list[web.RouteDef] = []
        if deps.account_data is not None:
            routes += AccountDataRoutes(deps.pool, deps.account_data).routes()
            routes += RoomMarkerRoutes(deps.pool, deps.account_data, deps.receipts).routes()
        if deps.device_lists is not None and deps.to_device is not None:
            routes += DeviceRoutes(deps.pool, deps.device_lists, deps.to_device).routes()
        return routes

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS":  # a browser's CORS preflight, for any path
            return web.Response(headers=CORS_HEADERS)
        response = await self._answer(request, handler)
        response.headers.update(CORS_HEADERS)
        return response

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.deps.accepting() and not request.path.startswith(
            ("/health", "/metrics", "/_fanout/internal")
        ):
            return unavailable("this worker is shutting down", 2).response()
        if _unprintable(request.path) or any(_unprintable(v) for v in request.query.values()):
            # No id, token or name has a control character; PostgreSQL would refuse a NUL in text.
            return ApiError(
                400, "M_INVALID_PARAM", "a path or query value holds a control character"
            ).response()
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status in (404, 405):
                return ApiError(e.status, "M_UNRECOGNIZED", "unrecognized request").response()
            if e.status == 413:
                return ApiError(413, "M_TOO_LARGE", "request body too large").response()
            if e.status >= 400:
                return ApiError(e.status, "M_UNKNOWN", e.reason).response()
            raise
        except Exception as e:
            error = api_error_for(e)
            if error is not None:
                return error.response()
            log.exception("request failed path=%s", request.path)
            return ApiError(500, "M_UNKNOWN", "internal error (logged)").response()

    async def versions(self, request: web.Request) -> web.Response:
        return web.json_response({"versions": SPEC_VERSIONS, "unstable_features": {}})

    async def well_known(self, request: web.Request) -> web.Response:
        base = f"{request.scheme}://{request.host}"
        return web.json_response({"m.homeserver": {"base_url": base}})

    async def capabilities(self, request: web.Request) -> web.Response:
        await requester(self.deps.pool, request)
        versions = {v: "stable" for v in SUPPORTED_ROOM_VERSIONS}
        return web.json_response(
            {
                "capabilities": {
                    "m.room_versions": {"default": self.deps.default_room_version, "available": versions},
                    "m.change_password": {"enabled": True},
                    "m.set_displayname": {"enabled": False},
                    "m.set_avatar_url": {"enabled": False},
                    "m.3pid_changes": {"enabled": False},
                }
            }
        )

    async def push_rules(self, request: web.Request) -> web.Response:
        await requester(self.deps.pool, request)
        return web.json_response({"global": {}})


def _unprintable(text: str) -> bool:
    return not text.isprintable()
