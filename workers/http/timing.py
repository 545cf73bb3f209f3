"""HTTP request duration by route: a middleware feeding one Prometheus histogram.

The label is the route's pattern (`/rooms/{room_id}/send/{event_type}`), never the raw path, so the
number of series stays bounded; requests that match no route count under `unmatched`. The
histogram is the lock-free kind (`pubsub.histograms`): every request pays for it, a parked /sync
re-poll included, so it costs a dict look-up and a bisect rather than prometheus_client's lock and
label resolution.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry

from pubsub.histograms import LockFreeHistogram

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def request_timing(registry: CollectorRegistry) -> Middleware:
    """A middleware observing each request's duration in `fanout_http_request_seconds{route,method}`."""
    duration = LockFreeHistogram(
        "fanout_http_request_seconds", "HTTP request duration by route", ["route", "method"],
        registry=registry,
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    )  # fmt: skip

    @web.middleware
    async def timing(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            return await handler(request)
        finally:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            duration.labels(route, request.method).observe(time.perf_counter() - started)

    return timing
