"""Stream ID generators and vector-clock tokens (issue 3).

`MultiWriterIdGenerator` hands out IDs from a shared Postgres sequence and tracks every writer's
position; `StreamPositions` is its pure bookkeeping; `MultiWriterStreamToken` and `SyncToken` are the
tokens clients hold; `InstanceMap` assigns the small integers tokens use instead of instance names.
"""

from __future__ import annotations

from idgen.errors import (
    IdGenError,
    InconsistentSequenceError,
    InvalidTokenError,
    NotAWriterError,
    UnknownInstanceError,
)
from idgen.instance_map import InstanceMap
from idgen.multi_writer import MultiWriterIdGenerator, StreamTable
from idgen.positions import StreamPositions
from idgen.tokens import MultiWriterStreamToken, SyncToken

__all__ = [
    "IdGenError",
    "InconsistentSequenceError",
    "InstanceMap",
    "InvalidTokenError",
    "MultiWriterIdGenerator",
    "MultiWriterStreamToken",
    "NotAWriterError",
    "StreamPositions",
    "StreamTable",
    "SyncToken",
    "UnknownInstanceError",
]
