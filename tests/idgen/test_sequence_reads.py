"""idgen.sequence_reads: the sequence reads of a pool's generators share statements."""

from __future__ import annotations

import asyncio

import asyncpg

from idgen import MultiWriterIdGenerator, SequenceReads

EVENTS = [("events", "instance_name", "stream_ordering")]
CACHES = [("cache_invalidation_stream_by_instance", "instance_name", "stream_id")]


async def _generators(
    pool: asyncpg.Pool, instance: str, reads: SequenceReads
) -> tuple[MultiWriterIdGenerator, MultiWriterIdGenerator]:
    events = await MultiWriterIdGenerator.create(
        pool, stream_name="events", instance_name=instance, tables=EVENTS,
        sequence_name="events_stream_seq", writers=["w"], sequence_reads=reads,
    )  # fmt: skip
    caches = await MultiWriterIdGenerator.create(
        pool, stream_name="caches", instance_name=instance, tables=CACHES,
        sequence_name="cache_invalidation_stream_seq", writers=["w"], track_positions_table=False,
        sequence_reads=reads,
    )  # fmt: skip
    return events, caches


async def test_reads_of_one_turn_share_a_statement_that_teaches_every_generator(
    db_pool: asyncpg.Pool,
) -> None:
    writer_reads, reader_reads = SequenceReads(db_pool), SequenceReads(db_pool)
    writer = await _generators(db_pool, "w", writer_reads)
    reader = await _generators(db_pool, "r", reader_reads)
    try:
        for gen, n in zip(writer, (3, 2), strict=True):
            async with gen.get_next_mult(n):
                pass
        top_events = writer[0].known_allocated_token()
        top_caches = writer[1].known_allocated_token()
        assert reader[0].known_allocated_token() < top_events
        assert await asyncio.gather(*(g.get_max_allocated_token() for g in reader)) == [
            top_events,
            top_caches,
        ]
        assert reader_reads.statements == 1
        async with writer[0].get_next():
            pass
        assert await reader[1].get_max_allocated_token() == top_caches
        # The caches read taught the events generator its sequence's value too: no read of its own.
        assert reader[0].known_allocated_token() == top_events + 1
        assert reader_reads.statements == 2
    finally:
        for gen in (*writer, *reader):
            await gen.close()
