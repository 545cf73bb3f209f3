"""SQL of the to_device stream: messages waiting for local devices (`device_inbox`) and for remote
servers (`device_federation_outbox`), and the transaction ids of sends already done.

Both message tables take ids from `device_inbox_stream_seq`; a send is one id. Rows are inserted
by the sender's writer and deleted by whoever delivered them: a device's /sync once a later
`since` acknowledges them, the stand-in federation sender once sent. Nothing is ever updated.
"""

from __future__ import annotations

import json
from typing import Any

from workers.storage import Conn
from workers.storage.windows import Window

#: ($1 sender): the sender's newest send still waiting somewhere, (instance_name, stream_id), with
#: no instance_name when its messages were all delivered (`workers.handlers.placement.leases`).
LAST_WRITE = """
SELECT coalesce(
    (SELECT instance_name FROM device_inbox i WHERE i.stream_id = t.stream_id LIMIT 1),
    (SELECT instance_name FROM device_federation_outbox o WHERE o.stream_id = t.stream_id LIMIT 1)
) AS instance_name, t.stream_id
FROM device_inbox_txns t WHERE t.user_id = $1 ORDER BY t.stream_id DESC LIMIT 1
"""


async def claim_txn(conn: Conn, user_id: str, device_id: str, txn_id: str, stream_id: int) -> bool:
    """Record a send's transaction id; False when it was done before (write nothing then)."""
    claimed = await conn.fetchval(
        "INSERT INTO device_inbox_txns (user_id, device_id, txn_id, stream_id) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT DO NOTHING RETURNING 1",
        user_id, device_id, txn_id, stream_id,
    )  # fmt: skip
    return claimed is not None


async def devices_of(conn: Conn, user_ids: list[str]) -> dict[str, list[str]]:
    records = await conn.fetch(
        "SELECT user_id, device_id FROM devices WHERE user_id = ANY($1::text[]) ORDER BY 1, 2", user_ids
    )
    out: dict[str, list[str]] = {}
    for r in records:
        out.setdefault(r["user_id"], []).append(r["device_id"])
    return out


async def add_local(
    conn: Conn, messages: list[tuple[str, str, dict[str, Any]]], stream_id: int, instance: str
) -> None:
    """(user, device, message) for local devices, all at `stream_id`."""
    await conn.execute(
        "INSERT INTO device_inbox (user_id, device_id, stream_id, instance_name, message_json)"
        " SELECT u, d, $1, $2, m FROM unnest($3::text[], $4::text[], $5::text[]) AS x(u, d, m)",
        stream_id, instance, [u for u, _, _ in messages], [d for _, d, _ in messages],
        [json.dumps(m) for _, _, m in messages],
    )  # fmt: skip


async def add_remote(conn: Conn, outbox: dict[str, dict[str, Any]], stream_id: int, instance: str) -> None:
    """Per remote server, the messages (an EDU's content) to send, all at `stream_id`."""
    servers = sorted(outbox)
    await conn.execute(
        "INSERT INTO device_federation_outbox (destination, stream_id, instance_name, messages_json)"
        " SELECT d, $1, $2, m FROM unnest($3::text[], $4::text[]) AS x(d, m)",
        stream_id, instance, servers, [json.dumps(outbox[s]) for s in servers],
    )  # fmt: skip


async def entities_by_writer(
    conn: Conn, instance: str, low: int, high: int, limit: int
) -> list[tuple[int, str]]:
    """The stream's rows of `instance` in (low, high]: one (id, entity) per recipient user and per
    remote server, in stream order, the first `limit`. Messages already delivered (deleted) no
    longer appear: a reader only needs the entities of messages still waiting."""
    records = await conn.fetch(
        "SELECT stream_id, user_id AS entity FROM device_inbox"
        " WHERE instance_name = $1 AND stream_id > $2 AND stream_id <= $3"
        " UNION SELECT stream_id, destination FROM device_federation_outbox"
        " WHERE instance_name = $1 AND stream_id > $2 AND stream_id <= $3"
        " ORDER BY 1, 2 LIMIT $4",
        instance, low, high, limit,
    )  # fmt: skip
    return [(r["stream_id"], r["entity"]) for r in records]


async def messages_for_device(
    conn: Conn, user_id: str, device_id: str, window: Window, limit: int
) -> list[tuple[int, dict[str, Any]]]:
    """The device's messages inside `window`, oldest first, the first `limit`: (stream id, message)."""
    records = await conn.fetch(
        "SELECT stream_id, message_json FROM device_inbox WHERE user_id = $1 AND device_id = $2"
        f" AND {window.condition(3)} ORDER BY stream_id LIMIT $8",
        user_id, device_id, *window.params(), limit,
    )  # fmt: skip
    return [(r["stream_id"], json.loads(r["message_json"])) for r in records]


async def delete_delivered(conn: Conn, user_id: str, device_id: str, window: Window) -> int:
    """Delete the device's messages inside `window` (acknowledged by a later sync); how many."""
    status = await conn.execute(
        f"DELETE FROM device_inbox WHERE user_id = $1 AND device_id = $2 AND {window.condition(3)}",
        user_id, device_id, *window.params(),
    )  # fmt: skip
    return int(status.rsplit(" ", 1)[-1])


async def take_outbox(conn: Conn, limit: int) -> list[tuple[int, str]]:
    """Consume up to `limit` remote servers' messages, oldest first: (stream id, server)."""
    records = await conn.fetch(
        "DELETE FROM device_federation_outbox WHERE ctid IN (SELECT ctid FROM device_federation_outbox"
        " ORDER BY stream_id LIMIT $1) RETURNING stream_id, destination",
        limit,
    )
    return [(r["stream_id"], r["destination"]) for r in records]


async def delete_device_messages(conn: Conn, user_id: str, device_ids: list[str]) -> None:
    """A deleted device's messages will never be read."""
    await conn.execute(
        "DELETE FROM device_inbox WHERE user_id = $1 AND device_id = ANY($2::text[])", user_id, device_ids
    )
