"""workers.handlers.caches.lru: the LRU and its race with invalidations."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

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


class _Member(NamedTuple):
    room_id: str
    state_key: str
    membership: str
    type: str = "m.room.member"


@settings(max_examples=100, deadline=None)
@given(
    changes=st.lists(
        st.tuples(
            st.sampled_from(["!r1", "!r2"]), st.sampled_from(["@a", "@b", "@c"]),
            st.sampled_from(["join", "leave", "invite", "ban"]),
        ),
        max_size=30,
    ),
    loads=st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 30), st.sampled_from(["@a", "@b", "!r1", "!r2"]))
    ),
)  # fmt: skip
def test_member_events_applied_in_place_give_what_a_load_gives(
    changes: list[tuple[str, str, str]], loads: list[tuple[int, int, str]]
) -> None:
    """Rows applied in stream order, with loads reading the database at any point at or after
    the rows applied so far (a load sees committed rows whose RDATA has not come yet), leave the
    room caches equal to a load of the final database: no reload is needed per member event."""
    committed = 0

    def rooms_of(user: str, upto: int) -> UserRooms:
        history: dict[str, list[tuple[int, str]]] = {}
        for position, (room, member, membership) in enumerate(changes[:upto], start=1):
            if member == user:
                history.setdefault(room, []).append((position, membership))
        return UserRooms(frozenset(history), {r: tuple(h) for r, h in history.items()})

    def members_of(room: str, upto: int) -> frozenset[str]:
        last: dict[str, str] = {}
        for r, member, membership in changes[:upto]:
            if r == room:
                last[member] = membership
        return frozenset(m for m, value in last.items() if value == "join")

    async def rooms_for_user(user: str) -> UserRooms:
        return rooms_of(user, committed)

    async def joined_members(room: str) -> frozenset[str]:
        return members_of(room, committed)

    async def no_state(_room: str) -> dict[tuple[str, str], str]:
        return {}

    async def no_visibility(_room: str) -> tuple[tuple[int, str], ...]:
        return ()

    async def check() -> None:
        nonlocal committed
        caches = SyncCaches(rooms_for_user, joined_members, no_state, no_visibility, applies_events=True)
        for applied in range(len(changes) + 1):
            for at, ahead, key in loads:
                if at == applied:  # a load reads the rows committed by now, some not yet applied
                    committed = min(len(changes), applied + ahead)
                    if key.startswith("!"):
                        await caches.joined_members.get(key)
                    else:
                        await caches.rooms_for_user.get(key)
            if applied < len(changes):
                room, member, membership = changes[applied]
                committed = max(committed, applied + 1)
                caches.on_events([(applied + 1, _Member(room, member, membership))])
        committed = len(changes)
        for user in ("@a", "@b", "@c"):
            if user in caches.rooms_for_user:
                assert await caches.rooms_for_user.get(user) == rooms_of(user, len(changes))
        for room in ("!r1", "!r2"):
            if room in caches.joined_members:
                assert await caches.joined_members.get(room) == members_of(room, len(changes))

    asyncio.run(check())


async def test_a_worker_that_applies_events_keeps_its_room_caches_through_current_state_rows() -> None:
    """Such a worker's caches follow the events themselves: the caches stream's row for the same
    batch would only make it reload what it just updated."""
    loads: list[str] = []

    async def load(key: str) -> Any:
        loads.append(key)
        return frozenset() if key.startswith("!") else UserRooms(frozenset(), {})

    caches = SyncCaches(load, load, load, load, applies_events=True)  # type: ignore[arg-type]
    await caches.joined_members.get("!r1")
    await caches.rooms_for_user.get("@a")
    caches.on_events([(7, _Member("!r1", "@a", "join"))])
    caches.on_invalidations([CacheInvalidation(CURRENT_STATE_CACHE, ("!r1", "@a"), 1)])
    assert await caches.joined_members.get("!r1") == frozenset({"@a"})
    assert await caches.rooms_for_user.get("@a") == UserRooms(frozenset({"!r1"}), {"!r1": ((7, "join"),)})
    assert loads == ["!r1", "@a"]
    caches.forget_events([_Member("!r1", "@a", "leave")])  # a commit whose outcome is unknown
    assert "!r1" not in caches.joined_members and "@a" not in caches.rooms_for_user
