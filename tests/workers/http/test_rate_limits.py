"""The rate limiter against a real Redis (and a Redis Cluster): one budget shared by every limiter
on the prefix, peek and record for failed logins, and failing open when Redis goes away."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from tests.conftest import RedisTarget, both_backends
from tests.workers.conftest import MakeWorker
from workers.config import RateLimit
from workers.harness.faultproxy import FaultProxy, target_of, through
from workers.http import rate_limits
from workers.http.rate_limits import RateLimiter, RateLimitSettings

BURST_3 = RateLimit(per_second=2, burst_count=3)


def limiter(
    url: str, prefix: str, cluster: tuple[str, ...] = (), registry: CollectorRegistry | None = None
) -> RateLimiter:
    client = (
        rate_limits.RedisCluster.from_url(url) if cluster else rate_limits.redis.asyncio.Redis.from_url(url)
    )
    settings = RateLimitSettings({"message": BURST_3})
    return RateLimiter(client, prefix, settings, None, registry or CollectorRegistry())


@both_backends
async def test_two_limiters_share_one_budget(redis_target: RedisTarget, channel_prefix: str) -> None:
    first, second = (limiter(redis_target.url, channel_prefix, redis_target.cluster) for _ in range(2))
    try:
        taken = [await (first, second)[i % 2].retry_after_ms("message", "user", "@a:hs") for i in range(3)]
        assert taken == [0, 0, 0]
        wait_ms = await second.retry_after_ms("message", "user", "@a:hs")
        assert 0 < wait_ms <= 500  # one more is due after 1/per_second
        assert await first.retry_after_ms("message", "user", "@b:hs") == 0  # another subject's own budget
        await asyncio.sleep(wait_ms / 1000 + 0.05)
        assert await first.retry_after_ms("message", "user", "@a:hs") == 0
        with pytest.raises(rate_limits.ApiError) as refused:
            await first.check("message", "user", "@a:hs")
        assert refused.value.status == 429 and refused.value.errcode == "M_LIMIT_EXCEEDED"
        assert 0 < refused.value.extra["retry_after_ms"] <= 500
        assert refused.value.headers == {"Retry-After": "1"}
        async with redis_target.client() as client:
            ttl = await client.pttl(rate_limits.rate_limit_key(channel_prefix, "message", "user", "@a:hs"))
        assert 0 < ttl <= 1500  # the key goes once the budget is full again
    finally:
        await first.close()
        await second.close()


async def test_peek_takes_nothing_and_record_goes_over(redis_url: str, channel_prefix: str) -> None:
    rl = limiter(redis_url, channel_prefix)
    try:
        for _ in range(5):
            assert await rl.retry_after_ms("message", "account", "@c:hs", "peek") == 0
        for _ in range(10):  # failed logins are recorded even past the limit, capped at one burst
            await rl.record("message", "account", "@c:hs")
        wait_ms = await rl.retry_after_ms("message", "account", "@c:hs", "peek")
        assert 400 < wait_ms <= 500  # a full burst used: one more after 1/per_second, never longer
        await asyncio.sleep(wait_ms / 1000 + 0.05)
        assert await rl.retry_after_ms("message", "account", "@c:hs", "peek") == 0
    finally:
        await rl.close()


async def test_redis_gone_fails_open_logs_once_and_counts(
    redis_url: str, channel_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with FaultProxy(*target_of(redis_url)) as proxy:
        registry = CollectorRegistry()
        rl = limiter(through(redis_url, proxy), channel_prefix, registry=registry)
        try:
            for _ in range(3):
                assert await rl.retry_after_ms("message", "user", "@d:hs") == 0
            assert await rl.retry_after_ms("message", "user", "@d:hs") > 0
            proxy.cut()
            with caplog.at_level(logging.WARNING, logger=rate_limits.__name__):
                for _ in range(5):
                    await rl.check("message", "user", "@d:hs")  # let through
            assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
            assert "rate limits are off" in caplog.records[0].message
            assert registry.get_sample_value("fanout_rate_limit_unavailable_total") == 5
            proxy.restore()
            await asyncio.sleep(max(rate_limits.SKIP_AFTER_ERROR_S, 1.5) + 0.1)  # skip over, budget full
            waits = [await rl.retry_after_ms("message", "user", "@d:hs") for _ in range(4)]
            assert waits[:3] == [0, 0, 0] and waits[3] > 0  # limited again
        finally:
            await rl.close()


async def test_registration_attempts_are_limited_per_address(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """Calls that complete the auth stage count; the first call (the flows) does not. Limits hold
    on another worker, and an exempt address is not limited."""
    limits = {"rc_exempt_addresses": ["198.51.100.0/24"], "x_forwarded": True,
              "rc_registration": {"per_second": 0.1, "burst_count": 2}}  # fmt: skip
    first = await make_worker("p1", ["p1"], **limits)
    second = await make_worker("r1", ["p1"], **limits)
    urls = [f"http://127.0.0.1:{w.http_port}/_matrix/client/v3/register" for w in (first, second)]

    async def register(i: int, address: str, auth: bool = True) -> tuple[int, dict[str, Any]]:
        body = {
            "username": f"user{i}",
            "password": "pw",
            **({"auth": {"type": "m.login.dummy"}} if auth else {}),
        }
        async with http.post(urls[i % 2], json=body, headers={"X-Forwarded-For": address}) as resp:
            return resp.status, await resp.json()

    assert [(await register(i, "192.0.2.1", auth=False))[0] for i in range(4)] == [401] * 4
    answers = [await register(i, "192.0.2.1") for i in range(3)]
    assert [status for status, _ in answers] == [200, 200, 429]
    assert answers[2][1]["errcode"] == "M_LIMIT_EXCEEDED" and answers[2][1]["retry_after_ms"] > 0
    assert (await register(3, "192.0.2.2"))[0] == 200  # another address has its own budget
    assert [(await register(i, "198.51.100.9"))[0] for i in range(4, 8)] == [200] * 4


async def test_exempt_addresses_are_remembered_within_a_bound(redis_url: str, channel_prefix: str) -> None:
    """The exemption of an address is parsed once and remembered; the memo stays bounded, and an
    address that is not an IP address is never exempt."""
    client = rate_limits.redis.asyncio.Redis.from_url(redis_url)
    settings = RateLimitSettings({"message": BURST_3}, exempt_networks=(ipaddress.ip_network("10.0.0.0/8"),))
    rl = RateLimiter(client, channel_prefix, settings, None, CollectorRegistry())
    try:
        for _ in range(2):
            assert rl.exempt_address("10.1.2.3") and not rl.exempt_address("192.0.2.1")
            assert not rl.exempt_address("unknown") and not rl.exempt_address("::1")
        for i in range(rate_limits.EXEMPT_MEMO_SIZE + 10):
            assert rl.exempt_address(f"10.0.{i // 256 % 256}.{i % 256}")
        assert len(rl._exempt_memo) <= rate_limits.EXEMPT_MEMO_SIZE
        assert rl.exempt_address("10.1.2.3") and not rl.exempt_address("192.0.2.1")
    finally:
        await rl.close()
