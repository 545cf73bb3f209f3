"""Worker requests, the calling side: one authenticated HTTP request to the instance that owns a
stream or a duty, found in the configured `instance_map`.

Contract (see `workers.handlers.placement.forwarding.Forwarder`):
* Auth: `Authorization: Bearer <worker_secret>`; the owner compares it in constant time. A client
  request relayed to a worker's client API (`client_headers`) carries the client's own headers
  instead, and the receiving worker authenticates the client as if it had come directly.
* Positions: `X-Fanout-Positions: <stream>:<writer>=<token>,...` carries what this worker has
  seen of every stream, so the owner can wait (bounded) until it has seen as much before acting.
* Time: the whole call, retries included, takes at most `timeout_s` (or the call's own `timeout_s`).
* Retries with exponential backoff and jitter: a connection that could not be made is retried
  always (the owner never saw the request), and so is a 503 marked `UNPROCESSED_HEADER` (the
  owner refused it before acting); a request that may have reached the owner (timeout, reset,
  502/503/504) only when `idempotent`. The final `OwnerUnavailable` says whether its last
  failure proved the request unprocessed.
* Errors: `OwnerUnavailable` (down, unreachable, 5xx, no URL configured), `ForwardRefused` (4xx).
* Metrics per endpoint name: requests by outcome, retries, latency histogram.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Histogram

from workers.handlers.placement.forwarding import (
    UNPROCESSED_HEADER,
    WORKER_AUTH_ERRCODE,
    ForwardRefused,
    OwnerUnavailable,
)

log = logging.getLogger(__name__)
POSITIONS_HEADER = "X-Fanout-Positions"
RETRY_STATUSES = frozenset({502, 503, 504})
BACKOFF_BASE_S = 0.05
#: () -> {(stream, writer): token} this worker has seen.
PositionSource = Callable[[], Mapping[tuple[str, str], int]]


def format_positions(positions: Mapping[tuple[str, str], int]) -> str:
    return ",".join(f"{stream}:{writer}={token}" for (stream, writer), token in sorted(positions.items()))


def parse_positions(header: str, max_entries: int = 256) -> dict[tuple[str, str], int]:
    """The inverse of `format_positions`; raises ValueError on anything malformed."""
    out: dict[tuple[str, str], int] = {}
    if not header.strip():
        return out
    entries = header.split(",")
    if len(entries) > max_entries:
        raise ValueError("too many positions")
    for entry in entries:
        key, _, token = entry.strip().partition("=")
        stream, _, writer = key.partition(":")
        if not stream or not writer or not token.isdigit() or len(token) > 19:
            raise ValueError(f"bad position {entry!r}")
        out[(stream, writer)] = int(token)
    return out


class WorkerRequestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "fanout_worker_requests",
            "Worker requests sent, by endpoint and outcome",
            ["endpoint", "outcome"],
            registry=registry,
        )
        self.retries = Counter(
            "fanout_worker_request_retries",
            "Worker request attempts after the first",
            ["endpoint"],
            registry=registry,
        )
        self.latency = Histogram(
            "fanout_worker_request_seconds",
            "Worker request time, retries included",
            ["endpoint"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )


@dataclass(frozen=True)
class _Call:
    """One worker request as its caller gave it."""

    owner: str
    endpoint: str
    method: str
    path: str
    body: dict[str, Any] | None
    params: dict[str, str] | None
    idempotent: bool


class WorkerRequests:
    """The `Forwarder` of a worker: call `start()` inside the event loop, `close()` at shutdown."""

    def __init__(
        self,
        instance_map: Mapping[str, str],
        secret: str | None,
        registry: CollectorRegistry,
        *,
        positions: PositionSource | None = None,
        timeout_s: float = 5.0,
        attempts: int = 4,
    ) -> None:
        self.instance_map = dict(instance_map)
        self._secret = secret
        self._positions = positions
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.metrics = WorkerRequestMetrics(registry)
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(raise_for_status=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        owner: str,
        endpoint: str,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        idempotent: bool,
    ) -> dict[str, Any]:
        answer = await self._counted(_Call(owner, endpoint, method, path, body, params, idempotent))
        if not isinstance(answer, dict):
            raise OwnerUnavailable(owner, "answered something other than a JSON object")
        return answer

    async def relay(
        self, owner: str, method: str, path: str, client_headers: Mapping[str, str], timeout_s: float
    ) -> Any:
        """A client's request (path with its query) to `owner`'s client API with the client's own
        headers; `owner`'s JSON answer. Retried as an idempotent request, within `timeout_s`."""
        call = _Call(owner, "relay_read", method, path, None, None, True)
        return await self._counted(call, client_headers, timeout_s)

    async def _counted(
        self, call: _Call, client_headers: Mapping[str, str] | None = None, timeout_s: float | None = None
    ) -> Any:
        started = time.monotonic()
        outcome = "error"
        deadline = started + (self.timeout_s if timeout_s is None else timeout_s)
        try:
            headers = self._worker_auth(call.owner) if client_headers is None else dict(client_headers)
            if self._positions is not None:
                headers[POSITIONS_HEADER] = format_positions(self._positions())
            result = await self._request(call, headers, deadline)
            outcome = "ok"
            return result
        except ForwardRefused:
            outcome = "refused"
            raise
        except OwnerUnavailable:
            outcome = "unavailable"
            raise
        finally:
            self.metrics.requests.labels(call.endpoint, outcome).inc()
            self.metrics.latency.labels(call.endpoint).observe(time.monotonic() - started)

    def _worker_auth(self, owner: str) -> dict[str, str]:
        if self._secret is None:
            raise OwnerUnavailable(owner, "worker_secret is not configured here", retry_after_s=10)
        return {"Authorization": f"Bearer {self._secret}"}

    async def _request(self, call: _Call, headers: dict[str, str], deadline: float) -> Any:
        owner, endpoint, idempotent = call.owner, call.endpoint, call.idempotent
        base = self.instance_map.get(owner)
        if base is None:
            raise OwnerUnavailable(owner, "no URL for it in instance_map", retry_after_s=10, unprocessed=True)
        reason = "no attempt"
        unprocessed = True
        for attempt in range(self.attempts):
            if attempt:
                self.metrics.retries.labels(endpoint).inc()
                delay = BACKOFF_BASE_S * (2 ** (attempt - 1)) * (0.5 + random.random())
                if time.monotonic() + delay >= deadline:
                    break
                await asyncio.sleep(delay)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            session = self._session  # None once closed at shutdown, also between two attempts
            if session is None:
                raise OwnerUnavailable(owner, "worker requests are closed (shutting down)")
            try:
                async with session.request(
                    call.method,
                    base + call.path,
                    json=call.body,
                    params=call.params,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=remaining),
                ) as resp:
                    if resp.status in RETRY_STATUSES:
                        reason = f"HTTP {resp.status}"
                        unprocessed = resp.headers.get(UNPROCESSED_HEADER) == "1"
                        if idempotent or unprocessed:
                            continue
                        break
                    try:
                        answer = await resp.json(content_type=None) if resp.content_length != 0 else {}
                    except ValueError:  # not JSON: no worker of ours answers that way
                        raise OwnerUnavailable(owner, f"answered HTTP {resp.status} without JSON") from None
                    if resp.status >= 400:
                        if isinstance(answer, dict) and answer.get("errcode") == WORKER_AUTH_ERRCODE:
                            log.error(
                                "worker request refused by %s (%d): do the worker_secret values match?",
                                owner,
                                resp.status,
                            )
                        raise ForwardRefused(owner, resp.status, answer if isinstance(answer, dict) else {})
                    if resp.status >= 300:
                        raise OwnerUnavailable(owner, f"unexpected answer HTTP {resp.status}")
                    return answer
            except aiohttp.ClientConnectorError as e:
                reason = f"cannot connect: {e.os_error}"
                unprocessed = True
                continue  # never reached the owner: safe to retry any request
            except (aiohttp.ClientError, TimeoutError) as e:
                reason = f"{type(e).__name__}: {e}"
                unprocessed = False
                if idempotent:
                    continue
                break
        raise OwnerUnavailable(owner, reason, unprocessed=unprocessed)
