"""`fanout bench ratelimit`: what a cluster-wide rate-limit check costs, beside what it guards.

* check: one `RateLimiter` check (the GCRA script by EVALSHA on one key), sequential, beside the
  ceiling measured in the same run: a Redis PING round trip on the same kind of connection (no
  check can cost less than one round trip).
* send: `PUT .../send/...` to a persister process, sequential, alternating between a client
  address the limits apply to (two checks: the address, then the user) and one in
  `rc_exempt_addresses` (no check), so both see the same machine at the same moment. The ceiling
  is the exempt send: the send itself.

The limits are set far above the load, so every check is allowed and does its full work.
Prints one JSON document on stdout and the figures on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio
from prometheus_client import CollectorRegistry

from workers.config import RateLimit
from workers.embedded.services import given_or_embedded
from workers.harness.bench._common import Figure, drop_database, percentile, progress, scratch_database
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import ClusterClient
from workers.http.rate_limits import RateLimiter, RateLimitSettings
from workers.process import event_loop

CLIENT = "/_matrix/client/v3"
UNLIMITED = {"per_second": 1e6, "burst_count": 1_000_000}
LIMITED_ADDRESS, EXEMPT_ADDRESS = "192.0.2.1", "198.51.100.1"


def _summary(seconds: list[float]) -> dict[str, float]:
    micros = [s * 1e6 for s in seconds]
    return {
        "median_us": round(statistics.median(micros), 1),
        "p99_us": round(percentile(micros, 99), 1),
        "n": len(micros),
    }


async def _checks(redis_url: str, prefix: str, count: int) -> dict[str, Any]:
    client = redis.asyncio.Redis.from_url(redis_url)
    limit = RateLimit(per_second=UNLIMITED["per_second"], burst_count=UNLIMITED["burst_count"])
    limiter = RateLimiter(client, prefix, RateLimitSettings({"message": limit}), None, CollectorRegistry())
    pings: list[float] = []
    checks: list[float] = []
    try:
        await client.ping()
        await limiter.retry_after_ms("message", "user", "@warm:bench")  # loads the script
        for i in range(count):
            started = time.perf_counter()
            await client.ping()
            pings.append(time.perf_counter() - started)
            started = time.perf_counter()
            waited = await limiter.retry_after_ms("message", "user", f"@u{i % 50}:bench")
            checks.append(time.perf_counter() - started)
            assert waited == 0
    finally:
        await limiter.close()
    return {"ping": _summary(pings), "check": _summary(checks)}


async def _sends(admin_url: str, redis_url: str, prefix: str, count: int) -> dict[str, Any]:
    database_url = await scratch_database(admin_url, "ratelimit")
    cluster = LocalCluster(
        database_url, redis_url, Path(tempfile.mkdtemp(prefix="fanout-bench-ratelimit-")),
        persisters=1, sync_workers=0, background_workers=0, channel_prefix=prefix,
        extra_config={"x_forwarded": True, "rc_message": UNLIMITED,
                      "rc_exempt_addresses": ["127.0.0.0/8", f"{EXEMPT_ADDRESS}/32"]},
    )  # fmt: skip
    await cluster.start()
    timings: dict[str, list[float]] = {"limited": [], "exempt": []}
    try:
        async with aiohttp.ClientSession() as http:
            client = ClusterClient(http, cluster.urls, cluster.event_writers)
            await client.register(f"@bench-{uuid.uuid4().hex[:8]}")
            room = await client.create_room("public")
            base = f"{cluster.url('persister1')}{CLIENT}/rooms/{room}/send/m.room.message"
            for i in range(count * 2 + 20):
                kind = "limited" if i % 2 else "exempt"
                headers = {
                    "Authorization": f"Bearer {client.token}",
                    "X-Forwarded-For": LIMITED_ADDRESS if kind == "limited" else EXEMPT_ADDRESS,
                }
                started = time.perf_counter()
                async with http.put(f"{base}/t{i}", json={"body": "x"}, headers=headers) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
                if i >= 20:  # the first ones warm the connection and the caches
                    timings[kind].append(time.perf_counter() - started)
    finally:
        await cluster.stop()
        await drop_database(admin_url, database_url)
    return {kind: _summary(values) for kind, values in timings.items()}


async def _run(args: argparse.Namespace, admin_url: str, redis_url: str) -> dict[str, Any]:
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    progress(f"  {args.checks} checks beside as many PINGs")
    result: dict[str, Any] = {"checks": await _checks(redis_url, prefix, args.checks)}
    progress(f"  {args.sends} sends with their two checks, interleaved with {args.sends} exempt sends")
    result["sends"] = await _sends(admin_url, redis_url, prefix, args.sends)
    return result


def figures(result: dict[str, Any]) -> list[Figure]:
    checks, sends = result["checks"], result["sends"]
    extra = sends["limited"]["median_us"] - sends["exempt"]["median_us"]
    return [
        Figure("ratelimit", "one rate-limit check, median (ceiling: a Redis PING)",
               checks["check"]["median_us"], "us", checks["ping"]["median_us"]),
        Figure("ratelimit", "a send with its two checks, median (ceiling: an exempt send)",
               sends["limited"]["median_us"], "us", sends["exempt"]["median_us"]),
        Figure("ratelimit", "what the checks add to a send, median", extra, "us"),
    ]  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout bench ratelimit", description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", help="an admin URL (a benchmark database is created on it)")
    p.add_argument("--redis-url")
    p.add_argument("--checks", type=int, default=2000, help="checks (and PINGs) timed")
    p.add_argument("--sends", type=int, default=300, help="sends timed of each kind")
    args = p.parse_args(argv)
    with given_or_embedded(args.database_url, args.redis_url) as (admin_url, redis_url):
        result = event_loop.run(_run(args, admin_url, redis_url))
    print(json.dumps(result, indent=2))
    for figure in figures(result):
        progress(figure.line())
    return 0
