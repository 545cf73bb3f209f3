"""The stored streams' change caches never claim "unchanged" for a row they could not have seen:
rows written before this process started, or by a writer this process does not follow."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import asyncpg
import pytest

from workers.assembly import stored
from workers.assembly.stored import StoredStreams
from workers.config import STORED_STREAMS, WorkerConfig
from workers.handlers.caches import change_cache
from workers.handlers.sync.stored_sections import StoredSections
from workers.streams import to_device


async def _no_remote(_user: str) -> list[dict[str, Any]]:
    return []


async def _load(db_pool: asyncpg.Pool, database_url: str, redis_url: str) -> StoredStreams:
    config = WorkerConfig(instance_name="w1", database_url=database_url, redis_url=redis_url)
    return await StoredStreams.load(db_pool, config, lambda _stream: ["w1"], _no_remote)


async def _allocate(db_pool: asyncpg.Pool) -> int:
    value: int = await db_pool.fetchval(f"SELECT nextval('{to_device.SEQUENCE}')")
    return value


async def test_the_floor_starts_above_ids_a_removed_writer_allocated(
    db_pool: asyncpg.Pool, database_url: str, redis_url: str
) -> None:
    allocated = await _allocate(db_pool)  # by a writer no longer in stream_writers
    streams = await _load(db_pool, database_url, redis_url)
    changes = streams.changes[to_device.TO_DEVICE]
    assert changes.floor >= allocated
    assert changes.may_have_changed("@u:x", allocated - 1)


async def test_after_a_foreign_writer_the_floor_ends_above_its_ids(
    db_pool: asyncpg.Pool, database_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(change_cache, "BLIND_S", 0.05)
    streams = await _load(db_pool, database_url, redis_url)
    changes = streams.changes[to_device.TO_DEVICE]
    before = changes.floor
    allocated = await _allocate(db_pool)  # a foreign writer's row, never seen by this cache
    streams._foreign_writer(to_device.TO_DEVICE, "stranger")
    assert changes.may_have_changed("@u:x", before)  # blind: "maybe"
    await asyncio.sleep(0.06)
    # What a sync does first: the caches' parts it leaves alone need not exist here.
    sections = StoredSections(
        db_pool, cast(Any, None), streams.changes, streams.generators, cast(Any, None), cast(Any, None)
    )
    await sections.reopen_blind_caches()
    assert changes.may_have_changed("@u:x", before)  # below the new floor: "maybe", never "no"
    assert changes.floor >= allocated


def test_the_stored_streams_are_the_configs() -> None:
    """One list of the stored streams: the configuration's (`writers_of` applies it)."""
    assert tuple(stored._STREAMS) == STORED_STREAMS
