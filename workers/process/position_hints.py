"""At start-up: drop the Redis position hints that lie beyond their stream's sequence, loudly.

Nothing takes a position from the hints (`pubsub.keys`: they are for people and `fanout inspect`;
positions come from PostgreSQL and announced positions are bounded by the sequence). A hint
beyond the sequence means the database went back under a Redis that remembers the old cluster: a
restore whose sequences were not moved past what the old cluster handed out (docs/operations.md,
"Backup and restore"), or sequence values lost in a failover. Then the IDs between the sequence and
the hint will be handed out again, and clients holding tokens up to the hint would skip the new
events that get them: the warning says so and names the fix. The hint is deleted so that
`fanout inspect` shows no position the database cannot back (a live writer rewrites its own within
one announce interval).

Hints are read before the sequence: any hint a live writer wrote is then at or below the value read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from idgen import MultiWriterIdGenerator
from pubsub import keys

log = logging.getLogger(__name__)
#: The whole check gives up after this long (a Redis that accepts but never answers).
CHECK_TIMEOUT_S = 5.0


async def discard_hints_ahead(
    client: aioredis.Redis, prefix: str, generators: Mapping[str, MultiWriterIdGenerator]
) -> dict[str, dict[str, int]]:
    """Delete each stream's hints beyond its sequence (one warning per stream); what was deleted."""
    discarded: dict[str, dict[str, int]] = {}
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            for stream, generator in generators.items():
                ahead = await _discard(client, keys.positions_key(prefix, stream), stream, generator)
                if ahead:
                    discarded[stream] = ahead
    except (RedisError, OSError, TimeoutError) as e:  # a hint check never keeps a worker from starting
        log.warning("could not check the position hints in Redis (%s)", str(e) or "no answer")
    return discarded


async def _discard(
    client: aioredis.Redis, key: str, stream: str, generator: MultiWriterIdGenerator
) -> dict[str, int]:
    raw: dict[bytes | str, bytes | str] = await client.hgetall(key)
    if not raw:
        return {}
    # Hints hold wire tokens (positive for every stream, backfill's negated): compare alike.
    top = await generator.get_max_allocated_token()
    if not generator.positive:
        top = -top
    ahead = {}
    for field, value in raw.items():
        try:
            position = int(value)
        except ValueError:
            position = None  # not ours to read: a hint only people look at
        if position is not None and position > top:
            ahead[field.decode(errors="replace") if isinstance(field, bytes) else field] = position
    if not ahead:
        return {}
    log.warning(
        "position hints in Redis are beyond the database's sequence, discarded: stream=%s sequence=%d "
        "hints=%s; the IDs up to them will be handed out again and clients holding tokens up to them "
        "will skip those events: if the database was restored, stop every worker and move the stream "
        "sequences past the old cluster's positions (docs/operations.md, Backup and restore)",
        stream,
        top,
        ahead,
    )
    await client.hdel(key, *ahead)
    return ahead
