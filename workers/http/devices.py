"""Devices and to-device messages (`/_matrix/client/v3/...`).

* `GET /devices` -> `{"devices": [{"device_id", "display_name"?}]}`; `GET /devices/{deviceId}`.
* `PUT /devices/{deviceId}` `{"display_name"?}` -> `{}` (404 M_NOT_FOUND: no such device).
* `DELETE /devices/{deviceId}`, `POST /delete_devices` `{"devices": [...]}`: user-interactive
  auth with one stage, `m.login.password` (a call without `auth`, or with a wrong password, gets
  the 401 with the flows and a session). The devices' access tokens end with them.
* `PUT /sendToDevice/{eventType}/{txnId}` `{"messages": {userId: {deviceId or "*": content}}}` ->
  `{}`; a retry with the same txnId sends nothing twice.
Every device change is recorded on the device_lists stream (room-mates see it in
`device_lists.changed`); see `workers.handlers.stored.device_lists` and `workers.handlers.stored.to_device`.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from workers import identifiers
from workers.handlers.stored.device_lists import DeviceLists
from workers.handlers.stored.to_device import ToDeviceInbox
from workers.http.auth import confirm_password, forget_tokens, requester
from workers.http.bodies import json_body
from workers.http.errors import ApiError, checked
from workers.storage import users

CLIENT = "/_matrix/client/v3"
MAX_DEVICES_PER_DELETE = 1000
MAX_MESSAGE_BYTES = 256 * 1024


class DeviceRoutes:
    def __init__(self, pool: asyncpg.Pool, devices: DeviceLists, inbox: ToDeviceInbox) -> None:
        self._pool = pool
        self._devices = devices
        self._inbox = inbox

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(f"{CLIENT}/devices", self.list_devices),
            web.get(f"{CLIENT}/devices/{{device_id}}", self.get_device),
            web.put(f"{CLIENT}/devices/{{device_id}}", self.rename),
            web.delete(f"{CLIENT}/devices/{{device_id}}", self.delete_one),
            web.post(f"{CLIENT}/delete_devices", self.delete_many),
            web.put(f"{CLIENT}/sendToDevice/{{event_type}}/{{txn_id}}", self.send_to_device),
        ]

    async def list_devices(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        async with self._pool.acquire() as conn:
            found = await users.list_devices(conn, who.user_id)
        return web.json_response({"devices": [_device(d, name) for d, name in found]})

    async def get_device(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        async with self._pool.acquire() as conn:
            found = dict(await users.list_devices(conn, who.user_id))
        device_id = request.match_info["device_id"]
        if device_id not in found:
            raise ApiError(404, "M_NOT_FOUND", "no such device")
        return web.json_response(_device(device_id, found[device_id]))

    async def rename(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        body = await json_body(request)
        name = body.get("display_name")
        if name is not None and (not isinstance(name, str) or len(name) > 255 or "\x00" in name):
            raise ApiError(400, "M_INVALID_PARAM", "display_name: at most 255 characters, no NUL")
        if not await self._devices.rename(who.user_id, request.match_info["device_id"], name):
            raise ApiError(404, "M_NOT_FOUND", "no such device")
        return web.json_response({})

    async def delete_one(self, request: web.Request) -> web.Response:
        return await self._delete(request, [request.match_info["device_id"]], await json_body(request))

    async def delete_many(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        devices = body.get("devices")
        if (
            not isinstance(devices, list)
            or len(devices) > MAX_DEVICES_PER_DELETE
            or not all(isinstance(d, str) for d in devices)
        ):
            raise ApiError(400, "M_BAD_JSON", f"devices must be a list of up to {MAX_DEVICES_PER_DELETE} ids")
        return await self._delete(request, devices, body)

    async def _delete(
        self, request: web.Request, device_ids: list[str], body: dict[str, Any]
    ) -> web.Response:
        who = await requester(self._pool, request)
        await confirm_password(self._pool, who.user_id, body.get("auth"))
        if device_ids:
            forget_tokens(request, await self._devices.delete(who.user_id, device_ids))
        return web.json_response({})

    async def send_to_device(self, request: web.Request) -> web.Response:
        who = await requester(self._pool, request)
        event_type = checked(identifiers.check_event_type, request.match_info["event_type"])
        txn_id = request.match_info["txn_id"]
        if not txn_id or len(txn_id) > identifiers.MAX_ID_LENGTH:
            raise ApiError(400, "M_INVALID_PARAM", "txnId is 1 to 255 characters")
        body = await json_body(request, MAX_MESSAGE_BYTES)
        messages = body.get("messages")
        if not isinstance(messages, dict):
            raise ApiError(400, "M_BAD_JSON", "messages must map user ids to {device id: content}")
        for user_id, per_device in messages.items():
            checked(identifiers.check_user_id, user_id)
            if not isinstance(per_device, dict) or not all(
                isinstance(d, str) and 0 < len(d) <= identifiers.MAX_ID_LENGTH and isinstance(c, dict)
                for d, c in per_device.items()
            ):
                raise ApiError(400, "M_BAD_JSON", f"messages[{user_id}] must map device ids to objects")
        if messages:
            await self._inbox.send(who.user_id, who.device_id or "", txn_id, event_type, messages)
        return web.json_response({})


def _device(device_id: str, name: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"device_id": device_id}
    if name is not None:
        body["display_name"] = name
    return body
