"""Device lists: every change to a user's devices, recorded on the user's device_lists writer.

Local users: a device created at login, its keys uploaded (`POST /keys/upload`), renamed or
deleted. Each change runs on the user's writer (`workers.handlers.placement.stream_writes`) in one
transaction with its stream row and one outbound poke per remote server sharing a room with the
user, so a reader that learns of the change (and re-queries the keys) can never read the state
from before it. Access tokens go with their device, in the same transaction, with a caches-stream
row naming them (`CacheRows`; every device_lists writer writes the caches stream), so every worker
that caches tokens drops them within one replication delay, by catch-up if its RDATA is lost.

Remote users: a reader that needs a remote user's devices (`POST /keys/query`) answers from the
cached copy in PostgreSQL when it is fresh. Otherwise it asks the user's device_lists writer,
which fetches the list from the user's server (`RemoteDevices`: federation's
`GET /user/devices/{userId}`, a stand-in URL per server in `remote_servers`), stores it, and
answers; concurrent requests share one fetch. A list that changed is recorded as a change of that
user, so local users who share a room with them see it in `device_lists.changed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from workers.handlers.caches.lru import CacheRows
from workers.handlers.placement.forwarding import OwnerUnavailable
from workers.handlers.placement.stream_writes import UserStreamWrites, object_arg, text_arg, written
from workers.model import ACCESS_TOKEN_CACHE
from workers.storage import Conn, users
from workers.storage import device_lists as stream_store
from workers.storage import devices as store
from workers.storage import to_device as inbox_store
from workers.streams.device_lists import DeviceListRow

#: Fetches `user_id`'s device list from its server: the devices, or raises `RemoteUnreachable`.
RemoteDevices = Callable[[str], Awaitable[list[dict[str, Any]]]]
#: A change of a user's devices inside the write's transaction: True when something changed.
Mutation = Callable[[Conn], Awaitable[bool]]


class RemoteUnreachable(Exception):
    """The user's server could not be asked (no URL for it, down, or a bad answer)."""


class DeviceLists:
    def __init__(
        self,
        writes: UserStreamWrites,
        pool: asyncpg.Pool,
        server_name: str,
        fetch_remote: RemoteDevices,
    ) -> None:
        self.writes = writes
        self._pool = pool
        self.server_name = server_name
        self._fetch_remote = fetch_remote
        self._in_flight: dict[str, asyncio.Future[list[dict[str, Any]]]] = {}
        self.resyncs = 0
        #: Set by the worker on a device_lists writer: where the ended tokens are recorded.
        self.cache_rows: CacheRows | None = None
        writes.ops.update(
            ensure_device=self._ensure_device, set_keys=self._set_keys, rename=self._rename,
            delete=self._delete, resync=self._resync,
        )  # fmt: skip

    # -- any worker ------------------------------------------------------------------------------

    async def ensure_device(self, user_id: str, device_id: str, display_name: str | None) -> None:
        """Create the device unless it exists (a login): a change when it is new."""
        await self.writes.run(
            user_id,
            "ensure_device",
            {"user_id": user_id, "device_id": device_id, "display_name": display_name},
        )

    async def set_keys(self, user_id: str, device_id: str, keys: dict[str, Any]) -> bool:
        """Store the device's identity keys; False when there is no such device."""
        answer = await self.writes.run(
            user_id, "set_keys", {"user_id": user_id, "device_id": device_id, "keys": keys}
        )
        return answer.get("found") is True

    async def rename(self, user_id: str, device_id: str, display_name: str | None) -> bool:
        answer = await self.writes.run(
            user_id, "rename", {"user_id": user_id, "device_id": device_id, "display_name": display_name}
        )
        return answer.get("found") is True

    async def delete(
        self,
        user_id: str,
        device_ids: list[str] | None,
        *,
        except_device: str | None = None,
        except_token: str | None = None,
    ) -> list[str] | None:
        """Delete devices (None: every one, and every token of the user) with their access tokens
        and waiting messages, keeping `except_device` and the token whose key is `except_token`;
        the caches keys of the tokens that ended (None: possibly any)."""
        args = {"user_id": user_id, "device_ids": device_ids}
        if except_device is not None or except_token is not None:
            args |= {"except_device": except_device, "except_token": except_token}
        answer = await self.writes.run(user_id, "delete", args)
        ended = answer.get("ended_tokens")
        return ended if isinstance(ended, list) and all(isinstance(k, str) for k in ended) else None

    async def remote_devices(self, user_id: str) -> list[dict[str, Any]]:
        """A remote user's devices: the cached list when fresh, else resynced by the writer.
        Raises RemoteUnreachable or OwnerUnavailable."""
        async with self._pool.acquire() as conn:
            cached = await store.remote_device_list(conn, user_id)
        if cached is not None and not cached[1]:
            return cached[0]
        answer = await self.writes.run(user_id, "resync", {"user_id": user_id})
        devices = answer.get("devices")
        if not isinstance(devices, list):
            raise RemoteUnreachable(answer.get("error", "the writer could not resync the list"))
        return devices

    # -- on the writer ---------------------------------------------------------------------------

    async def _change(self, user_id: str, mutate: Mutation) -> dict[str, Any]:
        """Run `mutate` and, when it changed something, record the change with its pokes."""
        me = self.writes.name
        changed = False

        async def body(conn: Conn, ids: list[int]) -> list[tuple[int, Any]]:
            nonlocal changed
            changed = await mutate(conn)
            if not changed:
                return []
            servers: list[str] = []
            if user_id.partition(":")[2] == self.server_name:
                servers = await stream_store.remote_servers_sharing_rooms(conn, user_id, self.server_name)
            await stream_store.record_change(conn, user_id, servers, ids[0], me)
            return [(ids[0], DeviceListRow(entity)) for entity in (user_id, *servers)]

        position = await self.writes.here().write(1, body, [user_id], user_id)
        return {**written(position), "found": changed}

    async def _ensure_device(self, args: dict[str, Any]) -> dict[str, Any]:
        name = text_arg(args, "display_name", optional=True)
        return await self._device_change(args, users.create_device, name)

    async def _set_keys(self, args: dict[str, Any]) -> dict[str, Any]:
        return await self._device_change(args, store.set_device_keys, object_arg(args, "keys"))

    async def _rename(self, args: dict[str, Any]) -> dict[str, Any]:
        name = text_arg(args, "display_name", optional=True)
        return await self._device_change(args, users.rename_device, name)

    async def _device_change(
        self, args: dict[str, Any], change: Callable[[Conn, str, str, Any], Awaitable[bool]], value: Any
    ) -> dict[str, Any]:
        """`change(conn, user, device, value)` of the device `args` name, recorded when it changed."""
        user_id, device_id = text_arg(args, "user_id"), text_arg(args, "device_id")
        return await self._change(user_id, lambda conn: change(conn, user_id, device_id, value))

    async def _delete(self, args: dict[str, Any]) -> dict[str, Any]:
        user_id = text_arg(args, "user_id")
        device_ids = args.get("device_ids")
        if device_ids is not None and (
            not isinstance(device_ids, list) or not all(isinstance(d, str) for d in device_ids)
        ):
            raise ValueError("device_ids must be a list of strings or null")
        except_device = text_arg(args, "except_device", optional=True)
        except_token = text_arg(args, "except_token", optional=True)
        kept_token = None if except_token is None else bytes.fromhex(except_token)

        if self.cache_rows is None:
            raise OwnerUnavailable(self.writes.name, "this device_lists writer writes no caches stream")
        ended: list[str] | None = []
        async with self.cache_rows.reserve() as pending:

            async def mutate(conn: Conn) -> bool:
                nonlocal ended
                deleted, tokens = await users.delete_devices(
                    conn, user_id, device_ids, except_device, kept_token
                )
                if tokens:
                    ended = users.ended_token_keys(tokens)
                    await pending.write(conn, ACCESS_TOKEN_CACHE, ended)
                if deleted:
                    await inbox_store.delete_device_messages(conn, user_id, deleted)
                return bool(deleted)

            answer = await self._change(user_id, mutate)
        return {**answer, "ended_tokens": ended}

    async def _resync(self, args: dict[str, Any]) -> dict[str, Any]:
        user_id = text_arg(args, "user_id")
        if user_id.partition(":")[2] == self.server_name:
            raise ValueError(f"{user_id} is a local user: its devices are here")
        try:
            devices, changed = await self._fetch_shared(user_id)
        except RemoteUnreachable as e:  # an answer, not a failure of the request: no retries
            return {"error": str(e)}
        answer: dict[str, Any] = {"devices": devices}
        if changed:

            async def mutate(conn: Conn) -> bool:
                return True

            answer |= await self._change(user_id, mutate)
        return answer

    async def _fetch_shared(self, user_id: str) -> tuple[list[dict[str, Any]], bool]:
        """Fetch and store the list; concurrent calls share one fetch. (devices, changed)"""
        pending = self._in_flight.get(user_id)
        if pending is not None:
            return await asyncio.shield(pending), False
        future: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._in_flight[user_id] = future
        try:
            devices = await self._fetch_remote(user_id)
            async with self._pool.acquire() as conn:
                before = await store.remote_device_list(conn, user_id)
                await store.store_remote_device_list(conn, user_id, devices)
            self.resyncs += 1
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: a lone caller must not log "never retrieved"
            raise
        finally:
            del self._in_flight[user_id]
        future.set_result(devices)
        return devices, before is None or before[0] != devices
