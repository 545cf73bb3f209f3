"""Filters parsed once per worker: by (user, filter id) from the real store, and by inline text."""

from __future__ import annotations

import json

import asyncpg
import pytest

from workers.handlers.sync.filter import MAX_CACHED_INLINE_BYTES, FilterCache
from workers.storage import users

ONE = json.dumps({"room": {"timeline": {"limit": 1}, "rooms": ["!a:x"]}})


class CountedStore:
    """`users.get_filter` on the test's database, counting reads."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.reads = 0

    async def get(self, user_id: str, filter_id: int) -> str | None:
        self.reads += 1
        async with self.pool.acquire() as conn:
            return await users.get_filter(conn, user_id, filter_id)


async def test_an_uploaded_filter_is_read_and_parsed_once(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        assert await users.add_filter(conn, "@a:x", ONE) == 0
        assert await users.add_filter(conn, "@a:x", "{not json") == 1
    store = CountedStore(db_pool)
    filters = FilterCache(store.get)
    first = await filters.by_id("@a:x", 0)
    assert (first.timeline_limit, first.rooms) == (1, frozenset({"!a:x"}))
    assert await filters.by_id("@a:x", 0) is first and store.reads == 1
    # Another user's filter 0 is another filter; a missing one is not kept, so its upload is found.
    with pytest.raises(LookupError):
        await filters.by_id("@b:x", 0)
    async with db_pool.acquire() as conn:
        assert await users.add_filter(conn, "@b:x", ONE) == 0
    assert await filters.by_id("@b:x", 0) == first and store.reads == 3
    for _ in range(2):  # a bad one is refused each time, never kept
        with pytest.raises(ValueError):
            await filters.by_id("@a:x", 1)
    assert store.reads == 5


async def test_inline_filters_are_parsed_once_per_text(db_pool: asyncpg.Pool) -> None:
    filters = FilterCache(CountedStore(db_pool).get)
    first = await filters.by_text(ONE)
    assert await filters.by_text(ONE) is first and len(filters.inline) == 1
    with pytest.raises(ValueError, match="limit"):
        await filters.by_text('{"room": {"timeline": {"limit": -1}}}')
    long = json.dumps({"room": {"not_rooms": ["!" + "r" * MAX_CACHED_INLINE_BYTES]}})
    assert (await filters.by_text(long)).not_rooms and len(filters.inline) == 1
