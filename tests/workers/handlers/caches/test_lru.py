"""workers.handlers.caches.lru: the LRU and its race with invalidations."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.handlers.caches.lru import LruCache, SyncCaches
from workers.model import CURRENT_STATE_CACHE, CacheInvalidation, UserRooms


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


async def test_a_coalesced_row_invalidates_each_room_and_each_member() -> None:
    async def load(key: str) -> Any:
        return frozenset() if key.startswith("!") else {}

    caches = SyncCaches(load, load, load, load)  # type: ignore[arg-type]
    for key in ("!r1", "!r2", "!untouched"):
        await caches.current_state.get(key)
        await caches.joined_members.get(key)
    for key in ("@a", "@b", "@c"):
        await caches.rooms_for_user.get(key)
    caches.on_invalidations([CacheInvalidation(CURRENT_STATE_CACHE, ("!r1", "@a", "!r2", "@b"), 1)])
    assert "!r1" not in caches.current_state and "!r2" not in caches.current_state
    assert "!r1" not in caches.joined_members and "!r2" not in caches.joined_members
    assert "@a" not in caches.rooms_for_user and "@b" not in caches.rooms_for_user
    assert "!untouched" in caches.current_state and "@c" in caches.rooms_for_user


@settings(max_examples=100, deadline=None)
@given(
    memberships=st.dictionaries(
        st.sampled_from(["@a", "@b", "@c", "@d", "@e"]),
        st.dictionaries(st.sampled_from(["!r1", "!r2", "!r3"]), st.sampled_from(["join", "leave", "invite"])),
    ),
    among=st.lists(st.sampled_from(["@a", "@b", "@c", "@d", "@e", "@z"]), unique=True),
)
def test_sharing_a_room_among_a_few_is_the_same_as_among_everyone(
    memberships: dict[str, dict[str, str]], among: list[str]
) -> None:
    """Testing only the users who changed (`among`) must find exactly those of them that the
    member lists of the user's rooms hold."""

    async def rooms_for_user(user: str) -> UserRooms:
        rooms = memberships.get(user, {})
        return UserRooms(frozenset(rooms), {r: ((1, m),) for r, m in rooms.items()})

    async def joined_members(room: str) -> frozenset[str]:
        return frozenset(u for u, rooms in memberships.items() if rooms.get(room) == "join")

    async def no_state(_room: str) -> dict[tuple[str, str], str]:
        return {}

    async def no_visibility(_room: str) -> tuple[tuple[int, str], ...]:
        return ()

    async def check() -> None:
        caches = SyncCaches(rooms_for_user, joined_members, no_state, no_visibility)
        everyone = await caches.sharing_a_room("@a")
        assert await caches.sharing_a_room("@a", among) == everyone & set(among)

    asyncio.run(check())
