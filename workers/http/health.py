"""Health and metrics over HTTP, built from a worker's callbacks.

- `GET /health/live`: 200 while the process runs its event loop (nothing else is checked).
- `GET /health/ready` (and `/health`, its alias): 200 when the worker is ready, else 503 with
  `Retry-After`. The body is the worker's report: `ready`, `degraded` with its `reasons`, detail.
  Ready means Postgres and Redis reachable and every live writer's announced position applied;
  a writer silent past the configured time makes the worker `degraded`, never unready, so one
  dead persister does not take every reader out of service.
- `GET /metrics`: the registry in Prometheus text format. Gauges about readiness are computed by
  `ReadinessCollector`, and the caches' figures by `CacheCollector`, at scrape time, so a scrape
  never depends on someone calling /health.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

#: (ready, report) where the report holds at least "degraded" (bool) and "reasons" (list of str).
HealthCallback = Callable[[], tuple[bool, dict[str, Any]]]
#: (ready, degraded, ...): cheap, no metrics read (a collector must not collect the registry).
ReadinessCallback = Callable[[], tuple[Any, ...]]
RETRY_AFTER_S = 5


def health_routes(health: HealthCallback, registry: CollectorRegistry) -> list[web.RouteDef]:
    """The route table: live, ready (and its /health alias), metrics."""

    async def live(request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(request: web.Request) -> web.Response:
        is_ready, report = health()
        headers = {} if is_ready else {"Retry-After": str(RETRY_AFTER_S)}
        return web.json_response(
            {"ready": is_ready, **report}, status=200 if is_ready else 503, headers=headers
        )

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return [
        web.get("/health/live", live),
        web.get("/health/ready", ready),
        web.get("/health", ready),
        web.get("/metrics", metrics),
    ]


class ReadinessCollector(Collector):
    """`fanout_worker_ready` and `fanout_worker_degraded` (0/1), evaluated on each scrape;
    `before_scrape` runs first, for gauges the worker refreshes only when scraped."""

    def __init__(
        self, readiness: ReadinessCallback, before_scrape: Callable[[], None] = lambda: None
    ) -> None:
        self._readiness = readiness
        self._before_scrape = before_scrape

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The names only, so registering does not call `readiness` before the worker has started."""
        yield GaugeMetricFamily("fanout_worker_ready", "1 when /health/ready answers 200")
        yield GaugeMetricFamily("fanout_worker_degraded", "1 when a writer is silent (readiness unaffected)")

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self._before_scrape()  # refresh other scrape-time gauges (cache sizes)
        is_ready, degraded = self._readiness()[:2]
        yield GaugeMetricFamily(
            "fanout_worker_ready", "1 when /health/ready answers 200", value=int(is_ready)
        )
        yield GaugeMetricFamily(
            "fanout_worker_degraded", "1 when a writer is silent (readiness unaffected)",
            value=int(degraded),
        )  # fmt: skip


class CacheStats(Protocol):
    """What the scrape reads of a cache (an `LruCache`, or another cache's `CacheCounts`)."""

    @property
    def name(self) -> str: ...
    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...
    @property
    def evictions(self) -> int: ...
    @property
    def invalidations(self) -> int: ...
    def __len__(self) -> int: ...


class CacheCollector(Collector):
    """Per cache, read at scrape time from the caches' own counters (no work on the read path):
    `fanout_cache_entries`, `fanout_cache_hits_total`, `fanout_cache_misses_total`,
    `fanout_cache_evictions_total`, `fanout_cache_key_invalidations_total`."""

    def __init__(self, caches: Callable[[], Iterable[CacheStats]]) -> None:
        self._caches = caches

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._families(list(self._caches()))

    @staticmethod
    def _families(caches: Sequence[CacheStats] = ()) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        entries = GaugeMetricFamily("fanout_cache_entries", "Entries per cache", labels=["cache"])
        counters = {
            "hits": CounterMetricFamily(
                "fanout_cache_hits", "Cache look-ups answered from memory", labels=["cache"]
            ),
            "misses": CounterMetricFamily(
                "fanout_cache_misses", "Cache look-ups that loaded", labels=["cache"]
            ),
            "evictions": CounterMetricFamily(
                "fanout_cache_evictions", "Entries evicted (LRU)", labels=["cache"]
            ),
            "invalidations": CounterMetricFamily(
                "fanout_cache_key_invalidations", "Keys invalidated per cache", labels=["cache"]
            ),
        }
        for cache in caches:
            entries.add_metric([cache.name], len(cache))
            for attribute, family in counters.items():
                family.add_metric([cache.name], getattr(cache, attribute))
        yield entries
        yield from counters.values()
