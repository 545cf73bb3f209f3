"""Asking a remote server for a user's device list: federation's `GET /_matrix/federation/v1/user/
devices/{userId}`, at the base URL `remote_servers` names for the user's server (a stand-in for
federation's discovery and request signing, which the cluster does not implement)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from workers.handlers.stored.device_lists import RemoteUnreachable

TIMEOUT_S = 10.0


class FederationClient:
    def __init__(self, remote_servers: Mapping[str, str]) -> None:
        self.remote_servers = dict(remote_servers)

    async def user_devices(self, user_id: str) -> list[dict[str, Any]]:
        server = user_id.partition(":")[2]
        base = self.remote_servers.get(server)
        if base is None:
            raise RemoteUnreachable(f"no URL for server {server!r} in remote_servers")
        url = f"{base}/_matrix/federation/v1/user/devices/{quote(user_id, safe='')}"
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session,
                session.get(url) as resp,
            ):
                body = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise RemoteUnreachable(f"{server}: {type(e).__name__}: {e}") from None
        devices = body.get("devices") if isinstance(body, dict) else None
        if not isinstance(devices, list):
            raise RemoteUnreachable(f"{server} answered without a device list")
        return [d for d in devices if isinstance(d, dict) and isinstance(d.get("device_id"), str)]
