"""What handlers need to hand an operation to the instance that owns it (a stream's writer).

The transport is `workers.http.requests.WorkerRequests`; handlers see only the `Forwarder`
protocol and these errors, so they never import the HTTP edge.

Errors, and what the client API should answer:
* `OwnerUnavailable`: the owner is down, unreachable or shutting down after the bounded retries,
  or has no URL configured -> 503 with `Retry-After: <retry_after_s>` (errcode M_UNAVAILABLE
  or similar); the client retries later. `unprocessed` says the owner certainly did not act on
  the request (no connection was made, or it answered `UNPROCESSED_HEADER`): repeating it is
  safe even when it is not idempotent.
* `ForwardRefused`: the owner answered 4xx -> pass `status` and `body` on (its errcode stands).
  A 401/403 here means the workers' `worker_secret` differ: a configuration error, logged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
#: The first and the longest pause between tries of an owner that cannot take a request now.
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 0.5

#: The errcode an owner answers a refused worker secret with (not a Matrix one: clients never see
#: it; the forwarding worker turns it into a 503).
WORKER_AUTH_ERRCODE = "IO.FANOUT.WORKER_AUTH"
#: On a 503: the worker refused the request before acting on it (its writer is stopping, full, or
#: no longer holds its lease), so the caller may send it again, whatever the request.
UNPROCESSED_HEADER = "X-Fanout-Unprocessed"
#: The errcode (409) of a writer asked to write a room another writer holds; `holder` names it.
NOT_OWNER_ERRCODE = "IO.FANOUT.NOT_OWNER"


class WorkerRequestError(Exception):
    """Base of the worker-request errors."""


class OwnerUnavailable(WorkerRequestError):
    """The owner could not answer now; try again after `retry_after_s` seconds."""

    def __init__(self, owner: str, reason: str, retry_after_s: int = 2, *, unprocessed: bool = False) -> None:
        super().__init__(f"{owner} is unavailable ({reason}); retry in {retry_after_s}s")
        self.owner = owner
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.unprocessed = unprocessed


class ForwardRefused(WorkerRequestError):
    """The owner refused the request (4xx); `body` is its JSON error."""

    def __init__(self, owner: str, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{owner} refused the request: {status} {body}")
        self.owner = owner
        self.status = status
        self.body = body


class Forwarder(Protocol):
    """Sends one request to `owner` and returns its JSON answer (an object).

    `endpoint` names the operation for metrics (bounded set of names, never an ID). Only
    `idempotent` requests are retried once they may have reached the owner; a connection that
    was never made is retried in any case. Raises `OwnerUnavailable` or `ForwardRefused`.
    """

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
    ) -> dict[str, Any]: ...


async def retried_while_unavailable(
    request: Callable[[], Awaitable[T]], within_s: float, *, idempotent: bool = True
) -> T:
    """`request()`, tried again while it fails with `OwnerUnavailable` (the owner restarts or
    stops), for up to `within_s`: every such failure of an `idempotent` request, and of one that is
    not only when the owner certainly left it unprocessed (no connection made, or it said so)."""
    deadline = time.monotonic() + within_s
    pause = RETRY_FIRST_S
    while True:
        try:
            return await request()
        except OwnerUnavailable as e:
            if not (idempotent or e.unprocessed) or time.monotonic() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)


async def fetch_stream_rows(
    forwarder: Forwarder, instance: str, stream: str, from_token: int, to_token: int, limit: int
) -> tuple[list[Any], list[Any] | None]:
    """A memory stream's rows in (from_token, to_token] from its writer `instance` (its
    `/_fanout/internal/streams/{stream}` route): (rows, None), or ([], the writer's snapshot) when
    the writer answers "reset" (we are older than its history: it restarted, or we were away long)."""
    answer = await forwarder.request(
        instance, f"{stream}_rows", "GET", f"/_fanout/internal/streams/{stream}",
        params={"from": str(from_token), "to": str(to_token), "limit": str(limit)}, idempotent=True,
    )  # fmt: skip
    if answer.get("reset"):
        return [], list(answer.get("snapshot", []))
    return list(answer["rows"]), None
