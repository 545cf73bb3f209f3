"""The ID generators of the events, backfill and caches streams: their tables and sequences (the
stored streams' come with them, `workers.assembly.stored`). Loaded eagerly at start-up, so a write
never waits on a lazy load.
"""

from __future__ import annotations

import asyncpg

from idgen import MultiWriterIdGenerator, SequenceReads
from workers.config import WorkerConfig
from workers.streams.caches import CACHES
from workers.streams.events import BACKFILL, EVENTS

#: The events writer's `stream_positions` row may lag its writes by this long: the upsert rides on the
#: next allocation (no round trip of its own per batch, none before the sends are answered), or a
#: timer this long after the last one does it. A second, not less: at a few sends a second per
#: persister a shorter timer fired after nearly every send (a wake-up and a round trip each); the
#: row only sets where a starting reader begins, and the reader catches up from the tables.
EVENTS_POSITION_DELAY_S = 1.0
_EVENTS_TABLE = [("events", "instance_name", "stream_ordering")]


async def load_generators(
    pool: asyncpg.Pool, config: WorkerConfig, reads: SequenceReads
) -> dict[str, MultiWriterIdGenerator]:
    """The events, backfill (negative orderings) and caches streams' generators for this worker,
    their sequence reads shared through `reads`."""
    name = config.instance_name
    return {
        EVENTS: await MultiWriterIdGenerator.create(
            pool, stream_name=EVENTS, instance_name=name, tables=_EVENTS_TABLE,
            sequence_name="events_stream_seq", writers=config.writers_of(EVENTS),
            position_delay_s=EVENTS_POSITION_DELAY_S, sequence_reads=reads,
        ),
        BACKFILL: await MultiWriterIdGenerator.create(
            pool, stream_name=BACKFILL, instance_name=name, tables=_EVENTS_TABLE,
            sequence_name="events_backfill_stream_seq", writers=config.writers_of(BACKFILL), positive=False,
            sequence_reads=reads,
        ),
        CACHES: await MultiWriterIdGenerator.create(
            pool, stream_name=CACHES, instance_name=name,
            tables=[("cache_invalidation_stream_by_instance", "instance_name", "stream_id")],
            sequence_name="cache_invalidation_stream_seq", writers=config.writers_of(CACHES),
            track_positions_table=False, sequence_reads=reads,
        ),
    }  # fmt: skip
