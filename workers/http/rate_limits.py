"""Rate limits that hold across the cluster: one counter per (action, user or address) in Redis.

Each check is one Lua script on one key (GCRA: the key holds the "theoretical arrival time" in
milliseconds of Redis' own clock), so every worker a client talks to counts against the same
budget, and two workers checking at once cannot both take the last slot. Settings are Synapse's
`rc_*` ones: `per_second` sustained, `burst_count` at once. A refusal is `429 M_LIMIT_EXCEEDED`
with `retry_after_ms` and a `Retry-After` header.

Keys: `<prefix>:{rl:<action>:<scope>:<subject>}`, the hash tag right after the prefix (ACL
patterns `~<prefix>:*` keep matching); a check touches one key, so on a Redis Cluster the keys
spread over every shard. Each key expires when its budget is full again.

Redis unreachable: the limiter fails open (the request goes through), logs once until Redis answers
again, counts each check it lets through so in `fanout_rate_limit_unavailable_total`, and for
`SKIP_AFTER_ERROR_S` after a failure does not ask Redis, so a dead Redis does not add a timeout to
every request. The limiter has its own
connection, never the replication client's: limits never sit on the replication path.

Exempt: clients from `rc_exempt_addresses`, and (with `rc_exempt_admins`) server admins, who are
looked up only when a check would refuse them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg
import redis.asyncio
import redis.exceptions
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter
from redis.asyncio.cluster import RedisCluster

from workers.config import RateLimit, WorkerConfig
from workers.http.auth import ON_REQUESTER
from workers.http.errors import ApiError
from workers.storage import user_admin
from workers.storage.users import Requester

log = logging.getLogger(__name__)
SKIP_AFTER_ERROR_S = 1.0
REDIS_TIMEOUT_S = 0.5
#: Client addresses whose exemption is remembered at once (`RateLimiter.exempt_address`).
EXEMPT_MEMO_SIZE = 4096
CLIENT = "/_matrix/client/v3"
ROOM = f"{CLIENT}/rooms/{{room_id}}"

#: check: take one if allowed; peek: would one be allowed (nothing taken); record: take one even
#: over the limit (a failed login), capped at one full burst so the wait stays bounded.
Mode = Literal["check", "peek", "record"]

GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local emission = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = math.floor(tat + emission)
if ARGV[3] == 'record' then
  local cap = now + math.floor(emission * burst)
  if new_tat > cap then new_tat = cap end
  redis.call('SET', KEYS[1], new_tat, 'PX', math.max(1, new_tat - now))
  return 0
end
local allow_at = new_tat - emission * burst
if now < allow_at then return math.ceil(allow_at - now) end
if ARGV[3] == 'check' then
  redis.call('SET', KEYS[1], new_tat, 'PX', math.max(1, new_tat - now))
end
return 0
"""

#: route pattern and method -> the action whose limit it takes (rc_<action>)
ROUTE_ACTIONS: dict[tuple[str, str], str] = {
    ("PUT", f"{ROOM}/send/{{event_type}}/{{txn_id}}"): "message",
    ("PUT", f"{ROOM}/redact/{{event_id}}/{{txn_id}}"): "message",
    ("PUT", f"{ROOM}/state/{{event_type}}"): "message",
    ("PUT", f"{ROOM}/state/{{event_type}}/{{state_key}}"): "message",
    ("POST", f"{CLIENT}/join/{{room}}"): "joins",
    ("POST", f"{ROOM}/join"): "joins",
    ("POST", f"{ROOM}/invite"): "invites",
    ("POST", f"{CLIENT}/createRoom"): "room_creation",
}


def rate_limit_key(prefix: str, action: str, scope: str, subject: str) -> str:
    return f"{prefix}:{{rl:{action}:{scope}:{subject}}}"


@dataclass(frozen=True)
class RateLimitSettings:
    """The limits by action (None: unlimited), the exemptions and where the client address comes from."""

    limits: dict[str, RateLimit | None]
    exempt_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    exempt_admins: bool = True
    x_forwarded: bool = False

    @classmethod
    def from_config(cls, config: WorkerConfig) -> RateLimitSettings:
        login = config.rc_login
        return cls(
            limits={
                "message": config.rc_message,
                "registration": config.rc_registration,
                "login_address": login.address,
                "login_account": login.account,
                "login_failed": login.failed_attempts,
                "joins": config.rc_joins,
                "invites": config.rc_invites,
                "room_creation": config.rc_room_creation,
            },
            exempt_networks=tuple(ipaddress.ip_network(n, strict=False) for n in config.rc_exempt_addresses),
            exempt_admins=config.rc_exempt_admins,
            x_forwarded=config.x_forwarded,
        )


def limiter_client(config: WorkerConfig) -> redis.asyncio.Redis | RedisCluster:
    """The limiter's own Redis connection (short timeouts: a slow Redis must not hold a request)."""
    options: dict[str, Any] = {"socket_timeout": REDIS_TIMEOUT_S, "socket_connect_timeout": REDIS_TIMEOUT_S}
    if config.redis_cluster:
        return RedisCluster.from_url(config.redis_cluster[0], **options)
    return redis.asyncio.Redis.from_url(config.redis_url, **options)


class RateLimiter:
    """The cluster-wide limits of one worker; `check_*` raise the 429, `middleware` guards room routes."""

    def __init__(
        self,
        client: redis.asyncio.Redis | RedisCluster,
        prefix: str,
        settings: RateLimitSettings,
        pool: asyncpg.Pool | None,
        registry: CollectorRegistry,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self.settings = settings
        self._pool = pool
        self._script = client.register_script(GCRA)
        self._skip_until = 0.0
        self._down = False
        #: Addresses already judged against `exempt_networks`: parsing one costs more than the
        #: rest of an exempt request's check. Bounded: emptied when full.
        self._exempt_memo: dict[str, bool] = {}
        self.refused = Counter(
            "fanout_rate_limit_refused_total",
            "Requests refused with 429 M_LIMIT_EXCEEDED",
            ["action", "scope"],
            registry=registry,
        )
        self.unavailable = Counter(
            "fanout_rate_limit_unavailable_total",
            "Rate-limit checks let through because Redis did not answer (the limiter fails open)",
            registry=registry,
        )

    async def close(self) -> None:
        await self._client.aclose()

    def client_address(self, request: web.Request) -> str:
        if self.settings.x_forwarded:
            forwarded = request.headers.get("X-Forwarded-For")
            if forwarded:
                return forwarded.rsplit(",", 1)[-1].strip()
        return request.remote or "unknown"

    def exempt_address(self, address: str) -> bool:
        """Whether `address` is in `rc_exempt_addresses` (remembered per address: a client sends
        from one address, and parsing it is the costly part)."""
        if not self.settings.exempt_networks:
            return False
        memo = self._exempt_memo
        exempt = memo.get(address)
        if exempt is None:
            if len(memo) >= EXEMPT_MEMO_SIZE:
                memo.clear()
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                exempt = False
            else:
                exempt = any(ip in network for network in self.settings.exempt_networks)
            memo[address] = exempt
        return exempt

    async def retry_after_ms(self, action: str, scope: str, subject: str, mode: Mode = "check") -> int:
        """One GCRA step on (action, scope, subject): 0 when allowed, else the milliseconds to wait.
        Unlimited actions and an unreachable Redis answer 0."""
        limit = self.settings.limits.get(action)
        if limit is None:
            return 0
        if time.monotonic() < self._skip_until:
            self.unavailable.inc()
            return 0
        key = rate_limit_key(self._prefix, action, scope, subject)
        try:
            waited = await self._script(keys=[key], args=[1000.0 / limit.per_second, limit.burst_count, mode])
        except (redis.exceptions.RedisError, OSError, TimeoutError) as e:
            self.unavailable.inc()
            self._skip_until = time.monotonic() + SKIP_AFTER_ERROR_S
            if not self._down:
                self._down = True
                log.warning("rate limits are off: Redis did not answer (%s); letting requests through", e)
            return 0
        if self._down:
            self._down = False
            log.info("rate limits are on again: Redis answers")
        return int(waited)

    async def check(self, action: str, scope: str, subject: str, user_id: str | None = None) -> None:
        """Take one from the budget or raise 429 (unless `user_id` is an exempt admin)."""
        wait_ms = await self.retry_after_ms(action, scope, subject)
        if wait_ms and not await self._admin(user_id):
            self.refused.labels(action, scope).inc()
            raise limit_exceeded(wait_ms)

    async def check_peek(self, action: str, scope: str, subject: str) -> None:
        """Raise 429 if one more would be refused, taking nothing (failed logins: before the check)."""
        wait_ms = await self.retry_after_ms(action, scope, subject, "peek")
        if wait_ms:
            self.refused.labels(action, scope).inc()
            raise limit_exceeded(wait_ms)

    async def record(self, action: str, scope: str, subject: str) -> None:
        await self.retry_after_ms(action, scope, subject, "record")

    async def _admin(self, user_id: str | None) -> bool:
        if user_id is None or not self.settings.exempt_admins or self._pool is None:
            return False
        async with self._pool.acquire() as conn:
            return await user_admin.is_admin(conn, user_id)

    def middleware(self) -> Middleware:
        """Limits the room routes of `ROUTE_ACTIONS`: per client address, checked while the handler
        looks up the access token (the two round trips overlap), then per user once the token's
        owner is known (through `ON_REQUESTER`, before the handler acts)."""

        @web.middleware
        async def rate_limited(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            resource = request.match_info.route.resource
            action = None if resource is None else ROUTE_ACTIONS.get((request.method, resource.canonical))
            if action is None:
                return await handler(request)
            address = self.client_address(request)
            if self.exempt_address(address):
                return await handler(request)
            by_address = asyncio.ensure_future(self.retry_after_ms(action, "address", address))

            async def on_requester(who: Requester) -> None:
                wait_ms = await by_address
                if wait_ms and not await self._admin(who.user_id):
                    self.refused.labels(action, "address").inc()
                    raise limit_exceeded(wait_ms)
                await self.check(action, "user", who.user_id, who.user_id)

            request[ON_REQUESTER] = on_requester
            try:
                return await handler(request)
            finally:
                await by_address  # done already unless the handler refused before the token

        return rate_limited


def limit_exceeded(wait_ms: int) -> ApiError:
    return ApiError(
        429,
        "M_LIMIT_EXCEEDED",
        "too many requests; retry later",
        headers={"Retry-After": str(max(1, math.ceil(wait_ms / 1000)))},
        retry_after_ms=wait_ms,
    )
