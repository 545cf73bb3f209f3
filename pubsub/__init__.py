"""Replication of any stream over Redis pub/sub: writers publish rows and positions, readers apply them
in order, exactly once, and catch up from the database whenever a message was lost.

| module | holds |
|---|---|
| `wire.py` | the line grammar: commands, `parse_line`/`format_command`, and their fast paths (pure) |
| `streams.py` | `Stream` (name, row type, update function, generator, writers) and the row payloads |
| `handler.py` | the reader's rules: check and route each received line |
| `stream_queue.py` | one stream's serial queue: apply in order, detect gaps, catch up |
| `arrivals.py` | when a queue's entries were received (marked per socket read), for the stage histograms |
| `publisher.py` | the writer side: RDATA in token order, POSITION periodically and on request |
| `redis_transport.py` | connections, (s)publish/(s)subscribe, reconnects and their hooks |
| `quiet_link.py` | the one-server link that writes publishes and hint keys without replies |
| `redis_cluster_transport.py` | a Redis Cluster: one `RedisTransport` per primary, channels routed by slot |
| `client.py` | `ReplicationClient`, which wires the above for one process |
| `keys.py`, `metrics.py`, `ratelog.py` | channel and key names; counters; rate-limited logs |
| `histograms.py` | histograms cheap enough for the receive path (plain counts, samples at scrape) |
| `ticks.py` | the shared clock that every periodic loop of a second or more wakes on |
| `tasks.py`, `types.py`, `errors.py` | stopping tasks; shared types; `PubSubError` and below |

`pubsub` knows nothing of rooms or events and never imports `workers`, `analytics` or `idgen`:
an ID generator is whatever satisfies `types.IdGenerator`. Only the two transports talk to Redis;
database access is the update function each stream is handed.
"""

from __future__ import annotations

from pubsub.client import ReplicationClient, ReplicationSettings
from pubsub.errors import LateRowsError, PubSubError, StreamConfigError, WireError
from pubsub.streams import ApplyCallback, Stream, StreamRegistry
from pubsub.types import IdGenerator, PositionListener, Row, UpdateFunction

__all__ = [
    "ApplyCallback",
    "IdGenerator",
    "LateRowsError",
    "PositionListener",
    "PubSubError",
    "ReplicationClient",
    "ReplicationSettings",
    "Row",
    "Stream",
    "StreamConfigError",
    "StreamRegistry",
    "UpdateFunction",
    "WireError",
]
