"""SQL of the device_lists stream: which local users' device lists changed, and the outbound pokes
(one per remote server that shares a room with the user) that a federation sender consumes.

Both tables take ids from `device_lists_stream_seq`. One write (one id) records one user's change
and its pokes; the rows are only ever inserted, and the pokes deleted once sent.
"""

from __future__ import annotations

import time

from workers.storage import Conn
from workers.storage.windows import Window

#: ($1 user): the user's newest row of the stream, (instance_name, stream_id)
#: (`workers.handlers.placement.leases`).
LAST_WRITE = (
    "SELECT instance_name, stream_id FROM device_lists_stream WHERE user_id = $1"
    " ORDER BY stream_id DESC LIMIT 1"
)


async def record_change(
    conn: Conn, user_id: str, destinations: list[str], stream_id: int, instance: str
) -> None:
    """`user_id`'s device list changed at `stream_id`; tell `destinations` (remote servers)."""
    await conn.execute(
        "INSERT INTO device_lists_stream (stream_id, user_id, instance_name) VALUES ($1, $2, $3)",
        stream_id, user_id, instance,
    )  # fmt: skip
    if destinations:
        await conn.execute(
            "INSERT INTO device_lists_outbound_pokes (stream_id, destination, user_id, instance_name)"
            " SELECT $1, d, $2, $3 FROM unnest($4::text[]) AS d",
            stream_id, user_id, instance, destinations,
        )  # fmt: skip


async def remote_servers_sharing_rooms(conn: Conn, user_id: str, own_server: str) -> list[str]:
    """The other servers with a joined member in a room `user_id` is joined to."""
    records = await conn.fetch(
        "SELECT DISTINCT substr(m.state_key, strpos(m.state_key, ':') + 1) AS server"
        " FROM local_current_membership l JOIN current_state_events m ON m.room_id = l.room_id"
        " WHERE l.user_id = $1 AND l.membership = 'join' AND m.type = 'm.room.member'"
        " AND m.membership = 'join' ORDER BY 1",
        user_id,
    )
    return [r["server"] for r in records if r["server"] != own_server]


async def entities_by_writer(
    conn: Conn, instance: str, low: int, high: int, limit: int
) -> list[tuple[int, str]]:
    """The stream's rows of `instance` in (low, high]: one (id, entity) per changed user and per
    poked server, in stream order, the first `limit`."""
    records = await conn.fetch(
        "SELECT stream_id, user_id AS entity FROM device_lists_stream"
        " WHERE instance_name = $1 AND stream_id > $2 AND stream_id <= $3"
        " UNION SELECT stream_id, destination FROM device_lists_outbound_pokes"
        " WHERE instance_name = $1 AND stream_id > $2 AND stream_id <= $3"
        " ORDER BY 1, 2 LIMIT $4",
        instance, low, high, limit,
    )  # fmt: skip
    return [(r["stream_id"], r["entity"]) for r in records]


async def changed_users(conn: Conn, user_ids: list[str], window: Window) -> set[str]:
    """Which of `user_ids` had a device-list change inside `window`."""
    records = await conn.fetch(
        "SELECT DISTINCT user_id FROM device_lists_stream WHERE user_id = ANY($1::text[])"
        f" AND {window.condition(2)}",
        user_ids, *window.params(),
    )  # fmt: skip
    return {r["user_id"] for r in records}


async def take_pokes(conn: Conn, limit: int) -> list[tuple[int, str, str]]:
    """Consume up to `limit` outbound pokes, oldest first: record each (server, user) as sent at
    its newest id and delete them. (stream id, server, user) of each consumed poke."""
    records = await conn.fetch(
        "DELETE FROM device_lists_outbound_pokes WHERE ctid IN (SELECT ctid FROM"
        " device_lists_outbound_pokes ORDER BY stream_id LIMIT $1)"
        " RETURNING stream_id, destination, user_id",
        limit,
    )
    if records:
        newest: dict[tuple[str, str], int] = {}
        for r in records:
            key = (r["destination"], r["user_id"])
            newest[key] = max(newest.get(key, 0), r["stream_id"])
        keys = sorted(newest)
        await conn.execute(
            "INSERT INTO device_lists_outbound_sent (destination, user_id, stream_id, sent_ts)"
            " SELECT d, u, s, $4 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS x(d, u, s)"
            " ON CONFLICT (destination, user_id) DO UPDATE SET stream_id = EXCLUDED.stream_id,"
            " sent_ts = EXCLUDED.sent_ts WHERE device_lists_outbound_sent.stream_id < EXCLUDED.stream_id",
            [d for d, _ in keys], [u for _, u in keys], [newest[k] for k in keys], int(time.time() * 1000),
        )  # fmt: skip
    return [(r["stream_id"], r["destination"], r["user_id"]) for r in records]
