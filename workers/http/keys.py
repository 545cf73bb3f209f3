"""Device keys (`/_matrix/client/v3/keys/...`).

* `POST /keys/upload` `{"device_keys"?, "one_time_keys"?, "fallback_keys"?}` ->
  `{"one_time_key_counts": {algorithm: n}}`: the requester's own device's identity keys (user_id
  and device_id must be the requester's), stored on the user's device_lists writer, which records
  the change for the user's room-mates; then its one-time and fallback keys, on the same writer
  (`workers.handlers.stored.one_time_keys`). The counts are those stored after the upload.
* `POST /keys/claim` `{"one_time_keys": {user: {device: algorithm}}}` -> `{"one_time_keys": {user:
  {device: {"algorithm:key_id": key}}}, "failures": {server: {...}}}`: one key per local device
  asked for, each one-time key handed out once; the fallback key when none is left. Remote users'
  servers are listed in `failures` (no federation client for claims).
* `POST /keys/query` `{"device_keys": {"@user:server": [device ids] or []}}` -> `{"device_keys":
  {user: {device: keys}}, "failures": {server: {...}}}`. Local users from their uploaded keys;
  remote users through `DeviceLists` (the cached list, or a resync by the device-list writer).
"""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.placement.forwarding import OwnerUnavailable
from workers.handlers.stored.device_lists import DeviceLists, RemoteUnreachable
from workers.handlers.stored.one_time_keys import KeyUploadRefused, OneTimeKeys, claimed_json, parse_keys
from workers.http.auth import requester
from workers.http.bodies import json_body
from workers.http.errors import ApiError, unavailable
from workers.storage import devices as store

CLIENT = "/_matrix/client/v3"
MAX_QUERIED_USERS = 1000
#: Devices one claim may ask keys of, over all its users.
MAX_CLAIMED_DEVICES = 10_000


class KeyRoutes:
    def __init__(
        self,
        pool: asyncpg.Pool,
        server_name: str,
        lists: DeviceLists | None = None,
        one_time_keys: OneTimeKeys | None = None,
    ) -> None:
        self._pool = pool
        self._server_name = server_name
        self.lists = lists
        self.one_time_keys = one_time_keys

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(f"{CLIENT}/keys/upload", self.upload),
            web.post(f"{CLIENT}/keys/query", self.query),
            web.post(f"{CLIENT}/keys/claim", self.claim),
        ]

    async def upload(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        body = await json_body(request)
        keys = body.get("device_keys")
        if keys is not None:
            if (
                not isinstance(keys, dict)
                or keys.get("user_id") != who.user_id
                or keys.get("device_id") != who.device_id
            ):
                raise ApiError(400, "M_INVALID_PARAM", "device_keys must name your own user_id and device_id")
            if self.lists is None or who.device_id is None:
                raise ApiError(400, "M_INVALID_PARAM", "this access token has no device")
            if not await self.lists.set_keys(who.user_id, who.device_id, keys):
                raise ApiError(400, "M_INVALID_PARAM", "this access token has no device")
        one_time, fallback = body.get("one_time_keys"), body.get("fallback_keys")
        try:
            parse_keys(one_time, "one_time_keys")
            parse_keys(fallback, "fallback_keys")
        except ValueError as e:
            raise ApiError(400, "M_BAD_JSON", str(e)) from None
        if one_time or fallback:
            if who.device_id is None:
                raise ApiError(400, "M_INVALID_PARAM", "this access token has no device")
            try:
                counts = await self._keys().upload(who.user_id, who.device_id, one_time, fallback)
            except KeyUploadRefused as e:
                raise ApiError(400, e.errcode, str(e)) from None
        elif who.device_id is None or self.one_time_keys is None:
            return web.json_response({"one_time_key_counts": {}})
        else:
            counts = await self.one_time_keys.counts(who.user_id, who.device_id)
        return web.json_response({"one_time_key_counts": counts.one_time})

    async def claim(self, request: web.Request) -> web.Response:
        await requester(self._pool, request)
        body = await json_body(request)
        wanted = body.get("one_time_keys")
        if not isinstance(wanted, dict):
            raise ApiError(400, "M_BAD_JSON", "one_time_keys maps user ids to {device id: algorithm}")
        triples: list[tuple[str, str, str]] = []
        failures: dict[str, Any] = {}
        for user_id, devices in wanted.items():
            try:
                identifiers.check_user_id(user_id)
            except ValueError as e:
                raise ApiError(400, "M_INVALID_PARAM", str(e)) from None
            if not isinstance(devices, dict) or not all(
                isinstance(a, str) and a.isprintable() and d.isprintable() for d, a in devices.items()
            ):
                raise ApiError(
                    400, "M_BAD_JSON", f"one_time_keys[{user_id!r}] maps device ids to an algorithm"
                )
            server = user_id.partition(":")[2]
            if server != self._server_name:
                failures[server] = {"status": 503, "message": f"{server}'s keys cannot be claimed here"}
                continue
            triples += [(user_id, device, algorithm) for device, algorithm in devices.items()]
            if len(triples) > MAX_CLAIMED_DEVICES:
                raise ApiError(400, "M_BAD_JSON", f"a claim asks for up to {MAX_CLAIMED_DEVICES} devices")
        claimed = await self._keys().claim(triples)
        return web.json_response({"one_time_keys": claimed_json(claimed), "failures": failures})

    def _keys(self) -> OneTimeKeys:
        if self.one_time_keys is None:
            raise unavailable("one-time keys are not served by this worker", 10)
        return self.one_time_keys

    async def query(self, request: web.Request) -> web.Response:
        await requester(self._pool, request)
        body = await json_body(request)
        wanted = body.get("device_keys")
        if not isinstance(wanted, dict) or len(wanted) > MAX_QUERIED_USERS:
            raise ApiError(
                400, "M_BAD_JSON", f"device_keys maps up to {MAX_QUERIED_USERS} user ids to device id lists"
            )
        for user_id, device_ids in wanted.items():
            try:
                identifiers.check_user_id(user_id)
            except ValueError as e:
                raise ApiError(400, "M_INVALID_PARAM", str(e)) from None
            if not isinstance(device_ids, list) or not all(isinstance(d, str) for d in device_ids):
                raise ApiError(400, "M_BAD_JSON", f"device_keys[{user_id!r}] must be a list of device ids")
        local = [u for u in wanted if u.partition(":")[2] == self._server_name]
        async with self._pool.acquire() as conn:
            found: dict[str, dict[str, Any]] = await store.local_device_keys(conn, local)
        failures: dict[str, Any] = {}
        for user_id in wanted:
            if user_id in local:
                continue
            server = user_id.partition(":")[2]
            try:
                if self.lists is None:
                    raise RemoteUnreachable("device lists are not served here")
                devices = await self.lists.remote_devices(user_id)
            except (RemoteUnreachable, OwnerUnavailable) as e:
                failures[server] = {"status": 503, "message": str(e)}
                continue
            found[user_id] = {d["device_id"]: d.get("keys", {}) for d in devices}
        answer = {
            user_id: {
                d: keys for d, keys in found.get(user_id, {}).items() if not device_ids or d in device_ids
            }
            for user_id, device_ids in wanted.items()
        }
        return web.json_response({"device_keys": answer, "failures": failures})
