"""workers.handlers.caches: the LRU and its race with invalidations."""

from __future__ import annotations

import asyncio

from workers.handlers.caches import LruCache


async def test_lru_evicts_and_a_load_overlapping_an_invalidation_is_not_stored() -> None:
    release = asyncio.Event()
    loads: list[str] = []

    async def load(key: str) -> str:
        loads.append(key)
        if key == "slow":
            await release.wait()
        return f"v{len(loads)}"

    cache: LruCache[str, str] = LruCache("t", 2, load)
    assert await cache.get("a") == "v1"
    assert await cache.get("a") == "v1" and cache.hits == 1
    await cache.get("b")
    await cache.get("c")
    assert "a" not in cache and len(cache) == 2 and cache.evictions == 1
    pending = asyncio.create_task(cache.get("slow"))
    await asyncio.sleep(0)
    cache.invalidate("slow")
    release.set()
    await pending
    assert "slow" not in cache  # loaded before the invalidation finished: never cached
