"""Stream IDs from a shared Postgres sequence, every writer's position, and the tokens clients hold.

| module | holds |
|---|---|
| `positions.py` | `StreamPositions`: pure bookkeeping of in-flight IDs, positions, persisted-upto |
| `multi_writer.py` | `MultiWriterIdGenerator`: the asyncpg edge (allocation, completion, position upserts) |
| `allocation.py` | `Allocation` and `Ride`, the blocks that hold allocated IDs, and `Probe` (no I/O) |
| `startup.py` | a generator's start-up read: positions checked against the sequence and tables, repaired |
| `_lane.py` | the few pool connections a generator keeps while busy |
| `sequence_reads.py` | `SequenceReads`: the sequence reads of a pool's generators, one statement per turn |
| `tokens.py` | `MultiWriterStreamToken` (a vector clock) and `SyncToken` (one per stream), and their texts |
| `instance_map.py` | `InstanceMap`: the small integers tokens use instead of instance names |
| `errors.py` | `IdGenError` and below, each saying what to do |

`idgen` never imports `pubsub`, `workers` or `analytics`; only `multi_writer.py`, `startup.py`,
`_lane.py`, `sequence_reads.py` and `instance_map.py` touch the database.
"""

from __future__ import annotations

from idgen.allocation import Allocation, Probe, Ride
from idgen.errors import (
    IdGenError,
    InconsistentSequenceError,
    InvalidTokenError,
    NotAWriterError,
    UnknownInstanceError,
)
from idgen.instance_map import InstanceMap
from idgen.multi_writer import MultiWriterIdGenerator
from idgen.positions import StreamPositions
from idgen.sequence_reads import SequenceReads
from idgen.startup import StreamTable
from idgen.tokens import MultiWriterStreamToken, SyncToken

__all__ = [
    "Allocation",
    "IdGenError",
    "InconsistentSequenceError",
    "InstanceMap",
    "InvalidTokenError",
    "MultiWriterIdGenerator",
    "MultiWriterStreamToken",
    "NotAWriterError",
    "Probe",
    "Ride",
    "SequenceReads",
    "StreamPositions",
    "StreamTable",
    "SyncToken",
    "UnknownInstanceError",
]
