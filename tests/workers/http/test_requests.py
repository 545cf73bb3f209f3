"""The worker-request client against a real HTTP server: auth and positions sent, retries only
where they are safe, clear errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from workers.embedded.services import free_port
from workers.handlers.placement.forwarding import ForwardRefused, OwnerUnavailable
from workers.http.requests import POSITIONS_HEADER, WorkerRequests, format_positions, parse_positions


class Owner:
    """A server that answers 503 to its first `failures` requests, then 200 (or `status`)."""

    def __init__(self, failures: int, status: int = 200) -> None:
        self.failures = failures
        self.status = status
        self.headers: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        if len(self.headers) <= self.failures:
            return web.json_response({"errcode": "SHUTTING_DOWN"}, status=503)
        return web.json_response({"ok": True} if self.status == 200 else {"errcode": "X"}, status=self.status)


Serve = Callable[[Owner], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    runners: list[web.AppRunner] = []

    async def start(owner: Owner) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", owner.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def client(url: str, timeout_s: float = 3.0) -> WorkerRequests:
    requests = WorkerRequests(
        {"owner": url}, "the-secret-the-secret", CollectorRegistry(), positions=lambda: {("events", "p1"): 7},
        timeout_s=timeout_s,
    )  # fmt: skip
    requests.start()
    return requests


async def test_an_idempotent_request_is_retried_and_carries_secret_and_positions(serve: Serve) -> None:
    owner = Owner(failures=2)
    requests = client(await serve(owner))
    try:
        assert await requests.request("owner", "ep", "GET", "/x", idempotent=True) == {"ok": True}
    finally:
        await requests.close()
    assert len(owner.headers) == 3
    assert owner.headers[0]["Authorization"] == "Bearer the-secret-the-secret"
    assert parse_positions(owner.headers[0][POSITIONS_HEADER]) == {("events", "p1"): 7}
    assert requests.metrics.retries.labels("ep")._value.get() == 2
    assert requests.metrics.requests.labels("ep", "ok")._value.get() == 1


async def test_a_request_that_may_have_been_applied_is_not_retried(serve: Serve) -> None:
    owner = Owner(failures=1)
    requests = client(await serve(owner))
    try:
        with pytest.raises(OwnerUnavailable, match="HTTP 503"):
            await requests.request("owner", "ep", "POST", "/x", body={}, idempotent=False)
    finally:
        await requests.close()
    assert len(owner.headers) == 1


async def test_a_4xx_is_a_refusal_and_an_unknown_owner_unavailable(serve: Serve) -> None:
    requests = client(await serve(Owner(failures=0, status=409)))
    try:
        with pytest.raises(ForwardRefused) as refused:
            await requests.request("owner", "ep", "PUT", "/x", body={}, idempotent=True)
        assert refused.value.status == 409 and refused.value.body == {"errcode": "X"}
        with pytest.raises(OwnerUnavailable, match="instance_map"):
            await requests.request("nobody", "ep", "GET", "/x", idempotent=True)
    finally:
        await requests.close()


async def test_retries_stop_at_the_timeout() -> None:
    requests = client(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    try:
        with pytest.raises(OwnerUnavailable, match="cannot connect"):
            await requests.request("owner", "ep", "POST", "/x", body={}, idempotent=False)
    finally:
        await requests.close()
    assert requests.metrics.latency.labels("ep")._sum.get() < 1.0


def test_positions_header_round_trip_and_refusals() -> None:
    positions = {("events", "p1"): 12, ("caches", "p-2.x"): 0}
    assert parse_positions(format_positions(positions)) == positions
    assert parse_positions("") == {}
    for bad in ("events=1", "events:p1=-1", "events:p1=x", ":p1=1", "events:p1=" + "9" * 20):
        with pytest.raises(ValueError):
            parse_positions(bad)
