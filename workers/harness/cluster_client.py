"""A Matrix client for the cluster, used by the demo, the load generator, the benchmarks and tests.

It speaks only the client-server API (`/_matrix/client/v3`) and knows nothing of routing: every
call goes to the worker named by `via`, or to a worker chosen at random. `sync` asks for
timelines of up to `timeline_limit` events per room (the harness wants every event, not the
spec's "recent" few) and `timeline_events` flattens an answer to its events with their room ids.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp

from workers.errors import WorkerError

CLIENT = "/_matrix/client/v3"
PASSWORD = "fanout-harness-password"


class RequestRefused(WorkerError):
    """A worker answered a request with an error status; `body` is its JSON answer."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body

    @property
    def errcode(self) -> str | None:
        return self.body.get("errcode") if isinstance(self.body, dict) else None


def timeline_events(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every timeline event of a /sync answer (joined and left rooms), each with its `room_id`."""
    out: list[dict[str, Any]] = []
    for section in ("join", "leave"):
        for room_id, room in body.get("rooms", {}).get(section, {}).items():
            out += [{**event, "room_id": room_id} for event in room.get("timeline", {}).get("events", [])]
    return out


def pending_events(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The user's own invite and knock events of a /sync answer: the entries of `invite_state` and
    `knock_state` that are whole events (they have an `event_id`; the stripped state has none),
    each with its `room_id`."""
    out: list[dict[str, Any]] = []
    for section in ("invite", "knock"):
        for room_id, room in body.get("rooms", {}).get(section, {}).items():
            events = room.get(f"{section}_state", {}).get("events", [])
            out += [{**event, "room_id": room_id} for event in events if "event_id" in event]
    return out


def receipts_seen(body: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(room, receipt type, user, event id) of every receipt in a /sync answer's joined rooms."""
    out: list[tuple[str, str, str, str]] = []
    for room_id, room in body.get("rooms", {}).get("join", {}).items():
        for event in room.get("ephemeral", {}).get("events", []):
            if event.get("type") != "m.receipt":
                continue
            for event_id, kinds in event.get("content", {}).items():
                for kind, users in kinds.items():
                    out += [(room_id, kind, user, event_id) for user in users]
    return out


def room_sections(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(section, room id) of every room a /sync answer lists under join, invite, leave or knock."""
    rooms = body.get("rooms", {})
    return [(s, r) for s in ("join", "invite", "leave", "knock") for r in rooms.get(s, {})]


def _q(value: str) -> str:
    return quote(value, safe="")


class ClusterClient:
    """One user's view of the cluster: `token` authenticates every call once `register` ran.

    `urls` maps worker names to base URLs; `event_writers` is kept for callers that report on
    placement, never used for routing. A call without `via` goes to a random worker of `balanced`
    when set (what a load balancer would pick from: the test may take workers out of it), else of
    `urls`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Mapping[str, str],
        event_writers: Sequence[str] = (),
        *,
        user_id: str | None = None,
        token: str | None = None,
        timeline_limit: int = 1000,
    ) -> None:
        self.session = session
        self.urls = dict(urls)
        self.event_writers = list(event_writers)
        self.user_id = user_id
        self.token = token
        self.device_id: str | None = None
        self.timeline_limit = timeline_limit
        self.balanced: Mapping[str, str] | None = None

    def _url(self, via: str | None) -> str:
        if via is not None:
            return self.urls[via]
        return random.choice(list((self.balanced if self.balanced is not None else self.urls).values()))

    async def _call(self, method: str, url: str, body: Any = None, **params: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with self.session.request(
            method, url, json=body, params=params or None, headers=headers
        ) as resp:
            text = await resp.text()
            try:
                data = json.loads(text)
            except ValueError:
                raise RequestRefused(resp.status, text) from None
            if resp.status != 200:
                raise RequestRefused(resp.status, data)
            return data

    def user(self, name: str) -> str:
        """A full user id for `name` (`@bob` or `bob` -> `@bob:<our server>`)."""
        if ":" in name:
            return name
        server = (self.user_id or "@x:localhost").partition(":")[2]
        return f"@{name.lstrip('@')}:{server}"

    async def register(self, name: str, via: str | None = None) -> str:
        """Register `name` (`@alice`, `alice` or `@alice:server`: the localpart counts) with a
        password and log in; the access token."""
        local = name.lstrip("@").partition(":")[0]
        body = {"username": local, "password": PASSWORD, "auth": {"type": "m.login.dummy"}}
        data = await self._call("POST", f"{self._url(via)}{CLIENT}/register", body)
        self.user_id, self.token, self.device_id = data["user_id"], data["access_token"], data["device_id"]
        return str(data["access_token"])

    async def create_room(self, join_rule: str = "public", via: str | None = None, **body: Any) -> str:
        preset = "public_chat" if join_rule == "public" else "private_chat"
        data = await self._call("POST", f"{self._url(via)}{CLIENT}/createRoom", {"preset": preset, **body})
        return str(data["room_id"])

    async def send(
        self,
        room_id: str,
        event_type: str,
        content: dict[str, Any],
        *,
        txn_id: str | None = None,
        via: str | None = None,
    ) -> dict[str, Any]:
        txn = txn_id or uuid.uuid4().hex
        url = f"{self._url(via)}{CLIENT}/rooms/{_q(room_id)}/send/{_q(event_type)}/{_q(txn)}"
        result: dict[str, Any] = await self._call("PUT", url, content)
        return result

    async def redact(
        self, room_id: str, event_id: str, reason: str | None = None, via: str | None = None
    ) -> str:
        """Redact `event_id`; the redaction's event id."""
        url = f"{self._url(via)}{CLIENT}/rooms/{_q(room_id)}/redact/{_q(event_id)}/{uuid.uuid4().hex}"
        result = await self._call("PUT", url, {} if reason is None else {"reason": reason})
        return str(result["event_id"])

    async def event(self, room_id: str, event_id: str, via: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "GET", f"{self._url(via)}{CLIENT}/rooms/{_q(room_id)}/event/{_q(event_id)}"
        )
        return result

    async def set_state(
        self, room_id: str, event_type: str, state_key: str, content: dict[str, Any], via: str | None = None
    ) -> dict[str, Any]:
        url = f"{self._url(via)}{CLIENT}/rooms/{_q(room_id)}/state/{_q(event_type)}/{_q(state_key)}"
        result: dict[str, Any] = await self._call("PUT", url, content)
        return result

    async def membership(
        self, room_id: str, membership: str, target: str | None = None, via: str | None = None
    ) -> dict[str, Any]:
        """join/leave/knock (yourself) or invite/leave (kick)/ban/unban another user, through the
        spec's endpoints."""
        base = f"{self._url(via)}{CLIENT}/rooms/{_q(room_id)}"
        other = target is not None and self.user(target) != self.user_id
        if membership == "join" and not other:
            result: dict[str, Any] = await self._call("POST", f"{base}/join", {})
        elif membership == "knock" and not other:
            result = await self._call("POST", f"{self._url(via)}{CLIENT}/knock/{_q(room_id)}", {})
        elif membership == "leave" and not other:
            result = await self._call("POST", f"{base}/leave", {})
        else:
            assert target is not None, f"{membership} needs a target"
            op = {"invite": "invite", "leave": "kick", "ban": "ban", "unban": "unban"}[membership]
            result = await self._call("POST", f"{base}/{op}", {"user_id": self.user(target)})
        return result

    async def typing(
        self, room_id: str, typing: bool, timeout_ms: int = 5000, via: str | None = None
    ) -> None:
        url = f"{self._url(via)}{CLIENT}/rooms/{_q(room_id)}/typing/{_q(str(self.user_id))}"
        await self._call("PUT", url, {"typing": typing, "timeout": timeout_ms})

    async def set_presence(
        self, presence: str, status_msg: str | None = None, via: str | None = None
    ) -> None:
        url = f"{self._url(via)}{CLIENT}/presence/{_q(str(self.user_id))}/status"
        await self._call("PUT", url, {"presence": presence, "status_msg": status_msg})

    async def backfill(self, room_id: str, events: list[dict[str, Any]], via: str | None = None) -> list[int]:
        url = f"{self._url(via)}/_fanout/admin/v1/rooms/{_q(room_id)}/backfill"
        data = await self._call("POST", url, {"events": events})
        return list(data["stream_orderings"])

    async def room_state(self, room_id: str, via: str | None = None) -> list[dict[str, Any]]:
        return list(await self._call("GET", f"{self._url(via)}{CLIENT}/rooms/{_q(room_id)}/state"))

    async def messages(self, room_id: str, *, via: str | None = None, **params: Any) -> dict[str, Any]:
        url = f"{self._url(via)}{CLIENT}/rooms/{_q(room_id)}/messages"
        result: dict[str, Any] = await self._call("GET", url, **params)
        return result

    async def put_account_data(
        self, data_type: str, content: dict[str, Any], room_id: str | None = None, via: str | None = None
    ) -> None:
        """Set the user's global (no room) or room account data of `data_type`."""
        user = f"{self._url(via)}{CLIENT}/user/{_q(str(self.user_id))}"
        room = "" if room_id is None else f"/rooms/{_q(room_id)}"
        await self._call("PUT", f"{user}{room}/account_data/{_q(data_type)}", content)

    async def set_tag(
        self, room_id: str, tag: str, content: dict[str, Any] | None, via: str | None = None
    ) -> None:
        """Tag a room (`content` None: remove the tag)."""
        url = f"{self._url(via)}{CLIENT}/user/{_q(str(self.user_id))}/rooms/{_q(room_id)}/tags/{_q(tag)}"
        await self._call("DELETE" if content is None else "PUT", url, {} if content is None else content)

    async def send_to_device(
        self,
        event_type: str,
        messages: dict[str, dict[str, Any]],
        txn_id: str | None = None,
        via: str | None = None,
    ) -> None:
        """`messages`: {user id: {device id or "*": content}}."""
        txn = txn_id or uuid.uuid4().hex
        url = f"{self._url(via)}{CLIENT}/sendToDevice/{_q(event_type)}/{_q(txn)}"
        await self._call("PUT", url, {"messages": messages})

    async def upload_keys(self, keys: dict[str, Any], via: str | None = None) -> None:
        """Upload this device's identity keys (`user_id` and `device_id` are filled in)."""
        body = {"device_keys": {**keys, "user_id": self.user_id, "device_id": self.device_id}}
        await self._call("POST", f"{self._url(via)}{CLIENT}/keys/upload", body)

    async def receipt(
        self, room_id: str, event_id: str, receipt_type: str = "m.read", via: str | None = None
    ) -> None:
        url = f"{self._url(via)}{CLIENT}/rooms/{_q(room_id)}/receipt/{_q(receipt_type)}/{_q(event_id)}"
        await self._call("POST", url, {})

    async def upload_one_time_keys(self, keys: dict[str, Any], via: str | None = None) -> dict[str, int]:
        """Upload one-time keys for this device; the counts the server holds after it."""
        data = await self._call("POST", f"{self._url(via)}{CLIENT}/keys/upload", {"one_time_keys": keys})
        return dict(data["one_time_key_counts"])

    async def claim_key(
        self, user_id: str, device_id: str, algorithm: str = "signed_curve25519", via: str | None = None
    ) -> list[str]:
        """Claim one key of `user_id`'s device; the key ids handed out (none when it has none)."""
        body = {"one_time_keys": {user_id: {device_id: algorithm}}}
        data = await self._call("POST", f"{self._url(via)}{CLIENT}/keys/claim", body)
        return list(data.get("one_time_keys", {}).get(user_id, {}).get(device_id, {}))

    async def sync(
        self, via: str | None = None, since: str | None = None, timeout_ms: int = 0, **params: Any
    ) -> dict[str, Any]:
        query: dict[str, Any] = {
            "timeout": timeout_ms,
            "filter": json.dumps({"room": {"timeline": {"limit": self.timeline_limit}}}),
            **params,
        }
        if since is not None:
            query["since"] = since
        result: dict[str, Any] = await self._call("GET", f"{self._url(via)}{CLIENT}/sync", **query)
        return result
