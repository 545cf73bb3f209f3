"""Device keys: local devices' uploaded keys, and cached device lists of remote users."""

from __future__ import annotations

import json
import time
from typing import Any

from workers.storage import Conn


async def set_device_keys(conn: Conn, user_id: str, device_id: str, keys: dict[str, Any]) -> bool:
    """Store a device's keys (False: no such device)."""
    done = await conn.fetchval(
        "UPDATE devices SET keys_json = $3 WHERE user_id = $1 AND device_id = $2 RETURNING 1",
        user_id,
        device_id,
        json.dumps(keys),
    )
    return bool(done)


async def local_device_keys(conn: Conn, user_ids: list[str]) -> dict[str, dict[str, Any]]:
    """user -> device -> keys, for the local devices that uploaded keys."""
    records = await conn.fetch(
        "SELECT user_id, device_id, keys_json, display_name FROM devices"
        " WHERE user_id = ANY($1::text[]) AND keys_json IS NOT NULL",
        user_ids,
    )
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        keys = json.loads(r["keys_json"])
        if r["display_name"]:
            keys.setdefault("unsigned", {})["device_display_name"] = r["display_name"]
        out.setdefault(r["user_id"], {})[r["device_id"]] = keys
    return out


async def remote_device_list(conn: Conn, user_id: str) -> tuple[list[dict[str, Any]], bool] | None:
    """(devices, stale) of a remote user's cached list; None when never fetched."""
    record = await conn.fetchrow("SELECT devices, stale FROM remote_device_lists WHERE user_id = $1", user_id)
    if record is None:
        return None
    devices = json.loads(record["devices"])
    return (devices if isinstance(devices, list) else []), bool(record["stale"])


async def store_remote_device_list(conn: Conn, user_id: str, devices: list[dict[str, Any]]) -> None:
    await conn.execute(
        "INSERT INTO remote_device_lists (user_id, devices, stale, fetched_ts) VALUES ($1, $2, false, $3)"
        " ON CONFLICT (user_id) DO UPDATE SET devices = EXCLUDED.devices, stale = false,"
        " fetched_ts = EXCLUDED.fetched_ts",
        user_id,
        json.dumps(devices),
        int(time.time() * 1000),
    )


async def mark_remote_stale(conn: Conn, user_id: str) -> None:
    await conn.execute("UPDATE remote_device_lists SET stale = true WHERE user_id = $1", user_id)
