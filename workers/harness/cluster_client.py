"""An HTTP client for the worker API, used by the demo, the benchmarks and the tests.

It knows the cluster's layout (instance -> base URL, the events writers in configured order), so
it sends each room's writes straight to the persister that owns the room (workers.routing).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from workers.errors import WorkerError
from workers.routing import writer_for_room


class RequestRefused(WorkerError):
    """A worker answered a request with an error status; `body` is its JSON answer."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class ClusterClient:
    """One user's view of the cluster: `token` authenticates every call once `register` ran."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: Mapping[str, str],
        event_writers: Sequence[str],
        *,
        user_id: str | None = None,
        token: str | None = None,
    ) -> None:
        self.session = session
        self.urls = dict(urls)
        self.event_writers = list(event_writers)
        self.user_id = user_id
        self.token = token
        self._writers_cycle = itertools.cycle(self.event_writers)

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

    def owner_url(self, room_id: str) -> str:
        return self.urls[writer_for_room(room_id, self.event_writers)]

    async def register(self, user_id: str, via: str | None = None) -> str:
        url = self.urls[via or self.event_writers[0]]
        data = await self._call("POST", f"{url}/register", {"user_id": user_id})
        self.user_id, self.token = user_id, data["access_token"]
        return str(data["access_token"])

    async def create_room(self, join_rule: str = "public", via: str | None = None) -> str:
        """Create a room on `via` (default: the events writers in turn); that writer will own it."""
        url = self.urls[via or next(self._writers_cycle)]
        data = await self._call("POST", f"{url}/createRoom", {"join_rule": join_rule})
        return str(data["room_id"])

    async def send(self, room_id: str, event_type: str, content: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", f"{self.owner_url(room_id)}/rooms/{room_id}/send/{event_type}", content
        )
        return result

    async def set_state(
        self, room_id: str, event_type: str, state_key: str, content: dict[str, Any]
    ) -> dict[str, Any]:
        url = f"{self.owner_url(room_id)}/rooms/{room_id}/state/{event_type}"
        if state_key:
            url += f"/{state_key}"
        result: dict[str, Any] = await self._call("POST", url, content)
        return result

    async def membership(self, room_id: str, membership: str, target: str | None = None) -> dict[str, Any]:
        return await self.set_state(
            room_id, "m.room.member", target or str(self.user_id), {"membership": membership}
        )

    async def backfill(self, room_id: str, events: list[dict[str, Any]]) -> list[int]:
        data = await self._call(
            "POST", f"{self.owner_url(room_id)}/rooms/{room_id}/backfill", {"events": events}
        )
        return list(data["stream_orderings"])

    async def room_state(self, room_id: str, via: str) -> list[dict[str, Any]]:
        data = await self._call("GET", f"{self.urls[via]}/rooms/{room_id}/state")
        return list(data["state"])

    async def sync(self, via: str, since: str | None = None, timeout_ms: int = 0) -> dict[str, Any]:
        params: dict[str, Any] = {"timeout": timeout_ms}
        if since is not None:
            params["since"] = since
        result: dict[str, Any] = await self._call("GET", f"{self.urls[via]}/sync", **params)
        return result
