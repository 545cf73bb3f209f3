"""SQL for `room_handovers` and `stream_handovers`: where a key changed writer, and the old
writer's last row of it.

A `room_handovers` row says: `writer` took the room under `epoch` when `after_writer` had written
its last event at `after_stream_id`. So every event of `writer` in the room above
`after_stream_id` comes after all of `after_writer`'s events there; the events stream's update
function gives each such event the pair (`after`), as the writer does on its live rows
(`workers.streams.events`). A `stream_handovers` row says the same of a stored stream's entity (a
user; a room, for receipts); there every row of `writer` above `after_stream_id` names it (a
stored row does not always name its key), see `workers.streams.handovers`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from workers.storage import Conn

#: (after_writer, after_stream_id) per room, in increasing `after_stream_id`.
Handovers = Mapping[str, Sequence[tuple[str, int]]]


#: ($1 room, $2 writer, $3 epoch, $4 old writer, $5 its last event): a room's hand-over.
RECORD_ROOM = (
    "INSERT INTO room_handovers (room_id, writer, epoch, after_writer, after_stream_id)"
    " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING"
)
#: ($1 entity, $2 writer, $3 epoch, $4 old writer, $5 its last row, $6 stream): an entity's.
RECORD_STREAM = (
    "INSERT INTO stream_handovers (entity, writer, epoch, after_writer, after_stream_id, stream)"
    " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING"
)


async def stream_handovers_to(conn: Conn, stream: str, writer: str, below: int) -> dict[str, list[int]]:
    """The old writers of `stream`'s entities `writer` took, each with the last rows (below
    `below`) it had written of them."""
    rows = await conn.fetch(
        "SELECT after_writer, after_stream_id FROM stream_handovers"
        " WHERE stream = $1 AND writer = $2 AND after_stream_id < $3",
        stream, writer, below,
    )  # fmt: skip
    found: dict[str, list[int]] = {}
    for row in rows:
        found.setdefault(row["after_writer"], []).append(row["after_stream_id"])
    return found


async def handovers_to(conn: Conn, writer: str, room_ids: Collection[str], below: int) -> Handovers:
    """The hand-overs of `room_ids` to `writer` whose old writer's last event is below `below`."""
    if not room_ids:
        return {}
    rows = await conn.fetch(
        "SELECT room_id, after_writer, after_stream_id FROM room_handovers"
        " WHERE writer = $1 AND room_id = ANY($2::text[]) AND after_stream_id < $3"
        " ORDER BY after_stream_id",
        writer, list(room_ids), below,
    )  # fmt: skip
    found: dict[str, list[tuple[str, int]]] = {}
    for row in rows:
        found.setdefault(row["room_id"], []).append((row["after_writer"], row["after_stream_id"]))
    return found


def after_of(handovers: Handovers, room_id: str, stream_ordering: int) -> tuple[str, int] | None:
    """What an event of the hand-overs' writer at `stream_ordering` in `room_id` depends on: the
    latest hand-over below it (its old writer and last event), or None."""
    latest = None
    for after in handovers.get(room_id, ()):
        if after[1] >= stream_ordering:
            break
        latest = after
    return latest
