"""`GET /sync` and the filters it can name (`POST|GET /user/{userId}/filter`).

Parameters as the spec has them: `since` (a `next_batch`; malformed: 400 M_INVALID_PARAM),
`timeout` (ms, capped at `MAX_SYNC_TIMEOUT_MS`), `full_state`, `filter` (inline JSON or the id of an
uploaded filter), `set_presence` (`offline`: this sync does not count the user as online).
"""

from __future__ import annotations

import contextlib
import json

import asyncpg
from aiohttp import web

from idgen import InvalidTokenError
from workers.handlers.sync.filter import FilterCache, SyncFilter
from workers.handlers.sync.handler import SyncHandler
from workers.http.auth import requester
from workers.http.bodies import json_body
from workers.http.ephemeral_routes import EphemeralServices
from workers.http.errors import ApiError, unavailable
from workers.http.read_forwarding import ReadRouting
from workers.storage import users

CLIENT = "/_matrix/client/v3"
MAX_SYNC_TIMEOUT_MS = 60_000


def long_poll_s(request: web.Request) -> float:
    """How long a /sync may wait for news (its `timeout`, capped), for a relay's own limit."""
    try:
        return max(0, min(int(request.query.get("timeout", "0")), MAX_SYNC_TIMEOUT_MS)) / 1000
    except ValueError:
        return 0.0


class SyncRoutes:
    def __init__(
        self,
        pool: asyncpg.Pool,
        sync: SyncHandler | None,
        services: EphemeralServices,
        reads: ReadRouting | None = None,
    ) -> None:
        self._pool = pool
        self._sync = sync
        self._services = services
        self.filters = FilterCache(self._stored_filter)
        self._read_routing = reads

    def routes(self) -> list[web.RouteDef]:
        sync = web.get(f"{CLIENT}/sync", self.sync)
        return [
            sync if self._read_routing is None else self._read_routing.route(sync, long_poll_s),
            web.post(f"{CLIENT}/user/{{user_id}}/filter", self.upload_filter),
            web.get(f"{CLIENT}/user/{{user_id}}/filter/{{filter_id}}", self.get_filter),
        ]

    async def sync(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        if self._sync is None:
            raise unavailable("this worker serves no reads (serve_reads: false) and relays none", 10)
        query = request.query
        try:
            timeout_ms = int(query.get("timeout", "0"))
        except ValueError:
            raise ApiError(400, "M_INVALID_PARAM", "timeout is a whole number of milliseconds") from None
        timeout_ms = max(0, min(timeout_ms, MAX_SYNC_TIMEOUT_MS))
        full_state = query.get("full_state", "false")
        if full_state not in ("true", "false"):
            raise ApiError(400, "M_INVALID_PARAM", "full_state is true or false")
        sync_filter = await self._filter(who.user_id, query.get("filter"))
        async with contextlib.AsyncExitStack() as stack:
            tracker = self._services.sync_tracker
            if tracker is not None and query.get("set_presence") != "offline":
                # The user is syncing here: presence counts them online until their last sync ends.
                await stack.enter_async_context(tracker.sync_request(who.user_id, who.device_id))
            try:
                result = await self._sync.sync(
                    who.user_id, query.get("since"), timeout_ms / 1000,
                    full_state=full_state == "true", sync_filter=sync_filter, device_id=who.device_id,
                )  # fmt: skip
            except InvalidTokenError as e:
                raise ApiError(400, "M_INVALID_PARAM", f"since: {e}") from None
        return web.Response(body=self._sync.answers.encode(result), content_type="application/json")

    async def _filter(self, user_id: str, value: str | None) -> SyncFilter | None:
        """The request's filter, parsed once per worker for each filter id or inline text."""
        if value is None:
            return None
        try:
            if value.lstrip().startswith("{"):
                return await self.filters.by_text(value)
            if not value.isdigit() or len(value) > 18:
                raise ApiError(400, "M_INVALID_PARAM", "filter is a JSON object or a filter id")
            return await self.filters.by_id(user_id, int(value))
        except LookupError:
            raise ApiError(404, "M_NOT_FOUND", f"no filter {value}") from None
        except ValueError as e:  # JSONDecodeError is one
            raise ApiError(400, "M_BAD_JSON", f"filter: {e}") from None

    async def _stored_filter(self, user_id: str, filter_id: int) -> str | None:
        async with self._pool.acquire() as conn:
            return await users.get_filter(conn, user_id, filter_id)

    def _own(self, user_id: str, request: web.Request) -> None:
        if request.match_info["user_id"] != user_id:
            raise ApiError(403, "M_FORBIDDEN", "filters belong to their user")

    async def upload_filter(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        self._own(who.user_id, request)
        body = await json_body(request)
        try:
            SyncFilter.parse(body)
        except ValueError as e:
            raise ApiError(400, "M_BAD_JSON", f"filter: {e}") from None
        async with self._pool.acquire() as conn:
            filter_id = await users.add_filter(conn, who.user_id, json.dumps(body))
        return web.json_response({"filter_id": str(filter_id)})

    async def get_filter(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        self._own(who.user_id, request)
        value = request.match_info["filter_id"]
        if not value.isdigit() or len(value) > 18:
            raise ApiError(404, "M_NOT_FOUND", "no such filter")
        async with self._pool.acquire() as conn:
            stored = await users.get_filter(conn, who.user_id, int(value))
        if stored is None:
            raise ApiError(404, "M_NOT_FOUND", "no such filter")
        return web.json_response(json.loads(stored))
