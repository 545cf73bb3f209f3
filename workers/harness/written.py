"""What the writers have written, read from the database, and whether a reader's token reached it:
the points the load waits for its readers to pass (the end of its setup, the end of its actions).
Harness only."""

from __future__ import annotations

from workers.harness.history import stream_token
from workers.storage import Conn

#: The stored streams whose positions the readers must reach (the events stream is read from
#: its table).
STORED_TARGETS = ("account_data", "device_lists", "to_device", "receipts")

#: stream -> writer -> position.
Positions = dict[str, dict[str, int]]


async def written_positions(conn: Conn) -> tuple[Positions, dict[str, int]]:
    """What every writer has written so far (the events stream's highest live ordering per writer,
    the stored streams' positions as upserted after their writes finish), and the writers'
    instance ids."""
    records = await conn.fetch(
        "SELECT instance_name, max(stream_ordering) AS m FROM events WHERE stream_ordering > 0"
        " GROUP BY instance_name"
    )
    mapped = await conn.fetch("SELECT instance_name, instance_id FROM instance_map")
    positions = await conn.fetch(
        "SELECT stream_name, instance_name, stream_id FROM stream_positions"
        " WHERE stream_name = ANY($1::text[])",
        list(STORED_TARGETS),
    )
    target: Positions = {"events": {r["instance_name"]: r["m"] for r in records}}
    for r in positions:
        target.setdefault(r["stream_name"], {})[r["instance_name"]] = r["stream_id"]
    return target, {r["instance_name"]: r["instance_id"] for r in mapped}


def covers(token: str, target: Positions, instance_ids: dict[str, int]) -> bool:
    """Whether each of `token`'s components is at or past every writer's position in `target`."""
    for stream, positions in target.items():
        component = stream_token(token, stream)
        for name, position in positions.items():
            if component.get_stream_pos_for_instance(str(instance_ids[name])) < position:
                return False
    return True
