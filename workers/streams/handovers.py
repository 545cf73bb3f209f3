"""What a row of a moved key depends on: the `after` field of the events and stored streams' rows.

A key (a room, a stored stream's user) that a writer took from another carries the old writer's
last row of it, read after the take made it final (`workers.handlers.placement.leases`). The rows the new
writer writes after that name it, as `(old writer, stream id)` pairs in their trailing `after`
field (`pubsub.streams`, dependencies): readers apply the old writer's rows up to there first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

from pydantic import Field

from pubsub.wire import MAX_TOKEN
from workers.storage import Conn
from workers.storage.handovers import stream_handovers_to

#: One dependency: a writer and the stream id its rows must be applied up to.
After = tuple[
    Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,200}$")], Annotated[int, Field(ge=1, le=MAX_TOKEN)]
]
#: The `after` field: a few of them (one per old writer), or None.
Afters = Annotated[tuple[After, ...], Field(max_length=64)]

RowT = TypeVar("RowT", bound=Any)


def with_afters(
    rows: Sequence[tuple[int, RowT]], afters: Sequence[tuple[str, int]]
) -> list[tuple[int, RowT]]:
    """`rows` (NamedTuples with an `after` field), each naming every pair of `afters` below its
    own stream id (a pair above it cannot concern it: the take came after)."""
    out = []
    for token, row in rows:
        named = tuple(pair for pair in afters if pair[1] < token)
        out.append((token, row._replace(after=named) if named else row))
    return out


async def stored_with_afters(
    conn: Conn, stream: str, writer: str, rows: list[tuple[int, RowT]]
) -> list[tuple[int, RowT]]:
    """A stored stream's catch-up `rows` of `writer`, with what they depend on
    (`stream_handovers`): for each old writer, its latest hand-over below each row."""
    if not rows:
        return rows
    found = await stream_handovers_to(conn, stream, writer, rows[-1][0])
    if not found:
        return rows
    out = []
    for token, row in rows:
        named = tuple(
            (old, max(x for x in ids if x < token))
            for old, ids in found.items()
            if any(x < token for x in ids)
        )
        out.append((token, row._replace(after=named) if named else row))
    return out
