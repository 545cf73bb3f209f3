"""Synthetic invalidation logs with counts known in closed form, generated inside Postgres.

Used by the benchmark (1M and 10M rows), the reconciliation tests and the notebook test. Rows are made with
`generate_series`, so volume costs no Python and no network. Row ``i`` (1..rows) has ``stream_id = first_id
+ i - 1``, writer ``instances[i % len(instances)]``, ``invalidation_ts = t0_ms + i * step_ms`` and, by
``i % 10``:

* 0: ``cs_cache_fake`` ``[room, 3 members]`` (a batched row, 4 keys);
* 1-4: ``get_user_by_id`` ``[user]``; 5-6: ``get_users_in_room`` ``[room]``;
* 7: ``get_membership`` ``[room, user]`` (one tuple key);
* 8: ``get_rooms_for_user`` ``[user]``, except every 100th row (``i % 100 == 98``), which is keys NULL.
* 9: ``get_user_by_id`` ``[user]``.

One event per `events_every` rows is persisted by the same writer at the same time (``events.received_ts``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import asyncpg

DEFAULT_T0_MS = 1_700_000_040_000  # a whole minute, so windows line up with i * step_ms
DEFAULT_INSTANCES = ("persister1", "persister2")

_INSERT_INVALIDATIONS = """
INSERT INTO cache_invalidation_stream_by_instance
    (stream_id, instance_name, cache_func, keys, invalidation_ts)
SELECT $1::bigint + i - 1,
       ($2::text[])[1 + i % cardinality($2::text[])],
       CASE WHEN i % 10 = 0 THEN 'cs_cache_fake'
            WHEN i % 10 IN (5, 6) THEN 'get_users_in_room'
            WHEN i % 10 = 7 THEN 'get_membership'
            WHEN i % 10 = 8 THEN 'get_rooms_for_user'
            ELSE 'get_user_by_id' END,
       CASE WHEN i % 10 = 0 THEN ARRAY['!r' || i % 1000, '@u' || i % 7919, '@u' || (i + 1) % 7919,
                                       '@u' || (i + 2) % 7919]
            WHEN i % 10 IN (5, 6) THEN ARRAY['!r' || i % 1000]
            WHEN i % 10 = 7 THEN ARRAY['!r' || i % 1000, '@u' || i % 7919]
            WHEN i % 100 = 98 THEN NULL
            ELSE ARRAY['@u' || i % 7919] END,
       $3::bigint + i * $4::bigint
FROM generate_series($5::bigint, $6::bigint) AS i
"""

_INSERT_EVENTS = """
INSERT INTO events (stream_ordering, event_id, instance_name, room_id, type, state_key, sender, json,
                    received_ts)
SELECT $1::bigint + i - 1, '$ev' || ($1::bigint + i - 1), ($2::text[])[1 + i % cardinality($2::text[])],
       '!r' || i % 1000, 'm.room.message', NULL, '@u' || i % 7919, '{}', $3::bigint + i * $4::bigint
FROM generate_series($5::bigint, $6::bigint) AS i
WHERE i % $7::bigint = 0
"""


async def generate_log(
    conn: asyncpg.Connection,
    rows: int,
    *,
    first_id: int = 1,
    instances: Sequence[str] = DEFAULT_INSTANCES,
    t0_ms: int = DEFAULT_T0_MS,
    step_ms: int = 6,
    events_every: int = 4,
    chunk: int = 1_000_000,
    progress: bool = False,
) -> None:
    """Insert `rows` invalidations (and rows // events_every events) as described in the module docstring.

    Inserts in chunks of `chunk` rows, one transaction each, so a 10M-row log does not hold one huge
    transaction; with `progress` it prints a line per chunk to stderr.
    """
    names = list(instances)
    for lo in range(1, rows + 1, chunk):
        hi = min(rows, lo + chunk - 1)
        async with conn.transaction():
            await conn.execute(_INSERT_INVALIDATIONS, first_id, names, t0_ms, step_ms, lo, hi)
            await conn.execute(_INSERT_EVENTS, first_id, names, t0_ms, step_ms, lo, hi, events_every)
        if progress:
            print(f"generate: {hi}/{rows} rows", file=sys.stderr, flush=True)
