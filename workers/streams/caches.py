"""The `caches` stream: batched cache invalidations (see workers.model.StateChanges).

It has no `stream_positions` rows (its generator is created with track_positions_table=False):
invalidations are idempotent and nothing needs a linear caches position after a restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, NamedTuple

import asyncpg
from pydantic import Field

from pubsub.streams import Stream
from pubsub.types import IdGenerator
from workers.model import KEYS_PER_INVALIDATION, CacheInvalidation
from workers.storage.events import invalidations_by_writer

CACHES = "caches"


class CacheRow(NamedTuple):
    """One invalidation on the wire; keys None means the whole cache."""

    cache_func: Annotated[str, Field(min_length=1, max_length=128)]
    keys: Annotated[tuple[str, ...] | None, Field(max_length=KEYS_PER_INVALIDATION)]
    invalidation_ts: Annotated[int, Field(ge=0)]

    @classmethod
    def of(cls, row: CacheInvalidation) -> CacheRow:
        return cls(row.cache_func, row.keys, row.invalidation_ts)

    def to_domain(self) -> CacheInvalidation:
        return CacheInvalidation(self.cache_func, self.keys, self.invalidation_ts)


def caches_stream(pool: asyncpg.Pool, generator: IdGenerator, writers: Sequence[str]) -> Stream[CacheRow]:
    async def update(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, CacheRow]]:
        async with pool.acquire() as conn:
            rows = await invalidations_by_writer(conn, instance, from_token, to_token, limit)
        return [(stream_id, CacheRow.of(row)) for stream_id, row in rows]

    return Stream(CACHES, CacheRow, update, generator, writers)
