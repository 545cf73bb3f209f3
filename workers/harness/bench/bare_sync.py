"""A bare server speaking just enough of /sync and send to be the long-poll benchmarks' ceiling.

What the benchmarks' client processes do against fanout, they do against this server in the same
run: the difference is what fanout's Matrix layer costs. It keeps no users and no database:

* `GET /_matrix/client/v3/sync?since=N&timeout=MS`: the poll's room is named by its access token
  (`Bearer room:<room id>`; any other token is in no room). Events of that room sent after
  position N are answered at once; otherwise the poll is held until one is sent or the timeout
  ends (then an empty answer). `next_batch` is the position of the last send.
* `PUT /_matrix/client/v3/rooms/{room}/send/{type}/{txnId}`: appends the JSON body as an event's
  content (the last `KEPT` per room are kept) and wakes the room's held polls.
* `/health` (with the pid of the process serving), and `/metrics` with `fanout_sync_waiting`
  (polls held), as a sync worker serves them.

`BareRooms` holds that behaviour apart from any HTTP server, so the same rooms can be carried by
aiohttp (fanout's server, here) or by an ASGI server (`bare_asgi.py`: uvicorn with httptools,
granian): what each server's own per-request work costs, measured with the same clients.
`bare_server.py` runs them as a process of its own.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import time

from aiohttp import web

from workers.harness.bench.poll_clients import CLIENT

#: Events kept per room: enough for any poll that is behind by less than that many sends.
KEPT = 1000
#: The HTTP servers the bare rooms run on, by name: the label each is reported under.
#: Polls one server may hold: granian refuses requests beyond its `backpressure` (1,024 by default).
MAX_HELD = 65_536


class BadRequest(ValueError):
    """A request the bare server answers with 400 (its message is the body's `error`)."""


class BareRooms:
    """The bare server's rooms: what a poll and a send answer (JSON bodies as bytes), whichever
    HTTP server carries them. One per server process; not thread-safe (one event loop). A held
    poll waits on a bare future and one timer, as fanout's `Waiter` does (no task per poll), so
    what the bare server costs beyond that is its HTTP server's."""

    def __init__(self) -> None:
        self.position = 0
        self.held = 0
        self._events: dict[str, collections.deque[tuple[int, dict[str, object]]]] = collections.defaultdict(
            lambda: collections.deque(maxlen=KEPT)
        )
        #: The held polls' futures by room (a dict as an ordered set: a poll leaves it in O(1)).
        self._waiting: dict[str, dict[asyncio.Future[None], None]] = collections.defaultdict(dict)

    def _answer(self, room: str, since: int) -> bytes:
        fresh = [event for at, event in self._events.get(room, ()) if at > since]
        body: dict[str, object] = {"next_batch": str(self.position)}
        if fresh:
            body["rooms"] = {"join": {room: {"timeline": {"events": fresh, "limited": False}}}}
        return json.dumps(body).encode()

    async def sync(self, authorization: str, since_text: str | None, timeout_text: str | None) -> bytes:
        """A poll's answer: at once when its room has events after `since`, else once a send
        wakes it or its timeout ends. Raises `BadRequest` for a `since` or `timeout` that is
        not an integer."""
        token = authorization.removeprefix("Bearer ")
        room = token.removeprefix("room:") if token.startswith("room:") else ""
        try:
            since = int(since_text or "0")
            timeout_s = int(timeout_text or "0") / 1000
        except ValueError:
            raise BadRequest("bad since or timeout") from None
        if since < self.position and any(at > since for at, _ in self._events.get(room, ())):
            return self._answer(room, since)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        waiting = self._waiting[room]
        waiting[waiter] = None
        timer = loop.call_later(timeout_s, _release, waiter)
        self.held += 1
        try:
            await waiter
        finally:
            self.held -= 1
            timer.cancel()
            waiting.pop(waiter, None)
        return self._answer(room, since)

    def send(self, room: str, event_type: str, body: bytes) -> bytes:
        """Append an event with `body` (JSON) as its content to `room` and wake its polls; the
        answer's body. Raises `BadRequest` when the body is not JSON."""
        try:
            content = json.loads(body)
        except ValueError:
            raise BadRequest("the body is not JSON") from None
        self.position += 1
        event_id = f"$bare{self.position}"
        event = {
            "event_id": event_id,
            "type": event_type,
            "sender": "@bare:localhost",
            "origin_server_ts": int(time.time() * 1000),
            "content": content,
        }
        self._events[room].append((self.position, event))
        for waiter in self._waiting.pop(room, {}):
            _release(waiter)
        return json.dumps({"event_id": event_id}).encode()

    def health(self) -> bytes:
        return json.dumps({"ready": True, "pid": os.getpid()}).encode()

    def metrics(self) -> bytes:
        return f"fanout_sync_waiting {self.held}\n".encode()


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def bad_request(error: BadRequest) -> bytes:
    """The body of a 400 answer."""
    return json.dumps({"errcode": "M_INVALID_PARAM", "error": str(error)}).encode()


def bare_app() -> web.Application:
    """The bare rooms on aiohttp, as fanout's workers serve."""
    rooms = BareRooms()

    def json_body(body: bytes, status: int = 200) -> web.Response:
        return web.Response(body=body, status=status, content_type="application/json")

    async def sync(request: web.Request) -> web.Response:
        query = request.query
        try:
            body = await rooms.sync(
                request.headers.get("Authorization", ""), query.get("since"), query.get("timeout")
            )
        except BadRequest as e:
            return json_body(bad_request(e), 400)
        return json_body(body)

    async def send(request: web.Request) -> web.Response:
        try:
            body = rooms.send(request.match_info["room"], request.match_info["type"], await request.read())
        except BadRequest as e:
            return json_body(bad_request(e), 400)
        return json_body(body)

    async def health(request: web.Request) -> web.Response:
        return json_body(rooms.health())

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=rooms.metrics(), content_type="text/plain")

    app = web.Application()
    app.router.add_get(CLIENT + "/sync", sync)
    app.router.add_put(CLIENT + "/rooms/{room}/send/{type}/{txn}", send)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app
