"""Remote users' device lists, kept fresh by one writer (`stream_writers.device_lists`).

A reader that needs a remote user's devices (`POST /keys/query`) answers from the cached copy in
PostgreSQL when it is fresh. When there is none, or it is marked stale, the reader never fetches
from the remote server itself: it asks the device-list writer (a worker request), which fetches the
list from the user's server (`RemoteDevices`: federation's `GET /user/devices/{userId}`; a stand-in
URL per server in `remote_servers`), stores it, and answers. One writer means one fetch per user at
a time for the whole cluster (concurrent requests share it), and one place that talks to remote
servers, as Synapse's device-list updater does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import asyncpg

from workers.handlers.forwarding import Forwarder, OwnerUnavailable
from workers.storage import devices as store

#: The duty's name in `stream_writers` (one writer).
DEVICE_LISTS = "device_lists"
#: Fetches `user_id`'s device list from its server: the devices, or raises `RemoteUnreachable`.
RemoteDevices = Callable[[str], Awaitable[list[dict[str, Any]]]]


class RemoteUnreachable(Exception):
    """The user's server could not be asked (no URL for it, down, or a bad answer)."""


class DeviceLists:
    def __init__(
        self,
        instance_name: str,
        writer: str | None,
        pool: asyncpg.Pool,
        fetch_remote: RemoteDevices,
    ) -> None:
        self.name = instance_name
        self.writer = writer
        self._pool = pool
        self._fetch_remote = fetch_remote
        self.forwarder: Forwarder | None = None
        self._in_flight: dict[str, asyncio.Future[list[dict[str, Any]]]] = {}
        self.resyncs = 0

    async def remote_devices(self, user_id: str) -> list[dict[str, Any]]:
        """The user's devices: the cached list when fresh, else resynced by the writer. Raises
        RemoteUnreachable or OwnerUnavailable."""
        async with self._pool.acquire() as conn:
            cached = await store.remote_device_list(conn, user_id)
        if cached is not None and not cached[1]:
            return cached[0]
        if self.writer is None:
            raise OwnerUnavailable("device-list writer", "stream_writers.device_lists is not configured", 30)
        if self.writer == self.name:
            return await self.resync_here(user_id)
        if self.forwarder is None:
            raise OwnerUnavailable(self.writer, "worker requests are not set up on this worker")
        path = f"/_fanout/internal/devices/{quote(user_id, safe='')}/resync"
        answer = await self.forwarder.request(
            self.writer, "device_resync", "POST", path, body={}, idempotent=True
        )
        devices = answer.get("devices")
        if not isinstance(devices, list):
            raise RemoteUnreachable(answer.get("error", "the writer could not resync the list"))
        return devices

    async def resync_here(self, user_id: str) -> list[dict[str, Any]]:
        """On the writer: fetch from the remote server and store; concurrent calls share one fetch."""
        pending = self._in_flight.get(user_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._in_flight[user_id] = future
        try:
            devices = await self._fetch_remote(user_id)
            async with self._pool.acquire() as conn:
                await store.store_remote_device_list(conn, user_id, devices)
            self.resyncs += 1
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: a lone caller must not log "never retrieved"
            raise
        finally:
            del self._in_flight[user_id]
        future.set_result(devices)
        return devices
