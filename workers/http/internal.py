"""Worker requests, the owner's side: the `/_fanout/internal/...` routes (mounted beside the client
API by `workers.assembly.ephemeral`).

Every route requires `Authorization: Bearer <worker_secret>`, compared with `hmac.compare_digest`:
no header gives 401, a wrong secret 403, and no secret configured here refuses everything (403).
Refusals are counted by reason and logged, rate-limited per peer address. Write routes first wait
(at most `POSITION_WAIT_S`) until this worker has seen the caller's `X-Fanout-Positions`; after
that they act anyway (counted), since the positions only order the write after what the caller saw.

Routes (JSON bodies and answers; errors are `{"errcode", "error"}`):
* `GET  /instance`                          -> `{"instance_name", "instance_id"}`
* `GET  /streams/{stream}?from=&to=&limit=` -> rows of an in-memory stream this worker writes:
  `{"reset": false, "rows": [[token, ...fields], ...]}` or, when `from` is older than the kept
  history, `{"reset": true, "snapshot": [[...fields], ...]}`
* `GET  /typing/{room_id}`                  -> this worker's view: `{"user_ids": [...], "token": n}`
* `PUT  /typing/{room_id}/{user_id}`        body `{"typing": bool, "timeout": ms}` -> `{}`
* `PUT  /presence/{user_id}`                body `{"presence": str, "status_msg": str|null}` -> `{}`
* `GET  /presence/{user_id}`                -> the m.presence event's `content`
* `POST /rooms/{room_id}/send`               body `{"event": {...}, "txn": bool, "target_was"?: [str]}`
  -> `{"event_id", "stream_ordering", "instance_name"}` (the room's rules checked here, on its
  persister; `target_was`: the memberships a kick or an unban acts on, checked with them)
* `POST /rooms/{room_id}/create`             body `{"events": [...]}` -> the same, of the last event
* `POST /rooms/{room_id}/backfill`           body `{"sender", "events": [{type, content}, ...]}` ->
  `{"stream_orderings": [...]}`
* `POST /rooms/{room_id}/remote_invite`      body: federation's invite body -> the invite event's
  place (`workers.http.federation`)
* `POST /rooms/{room_id}/purge`              body `{"block", "purge", "requested_by"}` -> the
  Delete Room API's answer (`workers.handlers.rooms.purge`)
* `POST /rooms/{room_id}/delete`             the same body -> `{"delete_id"}`: the deletion runs as
  a task on the room's writer (`workers.handlers.rooms.deletions`)
* `POST /writes/{stream}/{op}`                body: the operation's arguments, with `user_id` (a
  receipt: `room_id`) -> the operation's answer (`{"position": {"instance_name", "stream_id"},
  ...}`): a write of the account_data, device_lists or to_device stream on the user's writer, of
  the receipts stream on the room's (`workers.handlers.placement.stream_writes`; a remote user's device-list
  resync answers `{"devices"}` or `{"error"}` when the user's server could not be asked; a refused
  key upload or receipt answers `{"error", "errcode"}`)
Room routes answer a room rule's refusal with the client's errcode (M_FORBIDDEN, M_NOT_FOUND, ...),
which the forwarding worker passes on; a refused secret answers `IO.FANOUT.WORKER_AUTH`, which it
does not (the client gets a 503: the cluster is misconfigured, not the request).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from pubsub.ratelog import RateLimitedLog
from workers.handlers.placement.forwarding import WORKER_AUTH_ERRCODE
from workers.handlers.placement.stream_writes import UserStreamWrites
from workers.handlers.rooms.forwarded import RemoteInvite, event_from_json
from workers.handlers.rooms.purge import PurgeOptions
from workers.handlers.rooms.writes import RoomWrites
from workers.http.errors import api_error_for
from workers.http.requests import POSITIONS_HEADER, parse_positions
from workers.streams.presence import PRESENCE_STATES

log = logging.getLogger(__name__)
PREFIX = "/_fanout/internal"
POSITION_WAIT_S = 5.0
MAX_LIMIT = 10_000
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class InternalOps:
    """What the routes call; each raises `InternalError` for an answer other than 200, or
    ValueError for invalid input (400)."""

    instance_name: str
    instance_id: str
    stream_rows: Callable[[str, int, int, int], Awaitable[dict[str, Any]]]
    set_typing: Callable[[str, str, bool, int], Awaitable[None]]
    get_typing: Callable[[str], dict[str, Any]]
    set_presence: Callable[[str, str, str | None], Awaitable[None]]
    get_presence: Callable[[str], Awaitable[dict[str, Any]]]
    #: (positions, within_s) -> True when all were seen in time.
    wait_for_positions: Callable[[Mapping[tuple[str, str], int], float], Awaitable[bool]]


class InternalError(Exception):
    def __init__(self, status: int, errcode: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.errcode = errcode

    def response(self) -> web.Response:
        return web.json_response({"errcode": self.errcode, "error": str(self)}, status=self.status)


class InternalApi:
    def __init__(self, secret: str | None, ops: InternalOps, registry: CollectorRegistry) -> None:
        self._secret = secret.encode() if secret else None
        self.ops = ops
        self._ratelog = RateLimitedLog(log)
        self.refused = Counter(
            "fanout_internal_refused",
            "Internal requests refused before routing, by reason",
            ["reason"],
            registry=registry,
        )
        self.served = Counter(
            "fanout_internal_requests",
            "Internal requests served, by endpoint and status",
            ["endpoint", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "fanout_internal_request_seconds",
            "Internal request time",
            ["endpoint"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10),
        )
        self.position_timeouts = Counter(
            "fanout_internal_position_wait_timeouts",
            "Writes done before the caller's positions were seen",
            registry=registry,
        )

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(f"{PREFIX}/instance", self._wrap("instance", self.instance)),
            web.get(f"{PREFIX}/streams/{{stream}}", self._wrap("stream_rows", self.stream_rows)),
            web.get(f"{PREFIX}/typing/{{room_id}}", self._wrap("typing_view", self.typing_view)),
            web.put(f"{PREFIX}/typing/{{room_id}}/{{user_id}}", self._wrap("typing", self.typing)),
            web.put(f"{PREFIX}/presence/{{user_id}}", self._wrap("presence_set", self.put_presence)),
            web.get(f"{PREFIX}/presence/{{user_id}}", self._wrap("presence_get", self.get_presence)),
        ]

    def stream_write_routes(self, streams: Mapping[str, UserStreamWrites]) -> list[web.RouteDef]:
        """The writer's side of `UserStreamWrites.run`: one operation of a user-keyed stream."""

        async def write(request: web.Request) -> web.Response:
            writes = streams.get(request.match_info["stream"])
            if writes is None:
                raise InternalError(404, "M_NOT_FOUND", f"no stream {request.match_info['stream']!r} here")
            body = await _json_object(request)
            return web.json_response(await writes.serve(request.match_info["op"], body))

        return [web.post(f"{PREFIX}/writes/{{stream}}/{{op}}", self._wrap("stream_write", write))]

    def room_routes(self, writes: RoomWrites) -> list[web.RouteDef]:
        """The owner's side of `RoomWrites` forwarding."""

        async def send(request: web.Request) -> web.Response:
            body = await _json_object(request)
            event = event_from_json(body.get("event"))
            _same_room(request, event.room_id)
            expected = body.get("target_was")
            if expected is not None and not (
                isinstance(expected, list) and all(isinstance(m, str) for m in expected)
            ):
                raise ValueError("target_was must be a list of memberships")
            target_was = None if expected is None else frozenset(expected)
            written = await writes.send_here(event, txn=body.get("txn") is True, target_was=target_was)
            return web.json_response(written.to_json())

        async def create(request: web.Request) -> web.Response:
            body = await _json_object(request)
            items = body.get("events")
            if not isinstance(items, list) or not items:
                raise ValueError("events must be a non-empty list")
            events = [event_from_json(item) for item in items]
            _same_room(request, events[0].room_id)
            return web.json_response((await writes.create_here(events)).to_json())

        async def backfill(request: web.Request) -> web.Response:
            body = await _json_object(request)
            sender = body.get("sender")
            if not isinstance(sender, str):
                raise ValueError("sender must be a user id")
            orderings = await writes.backfill_here(request.match_info["room_id"], sender, body.get("events"))
            return web.json_response({"stream_orderings": orderings})

        async def remote_invite(request: web.Request) -> web.Response:
            body = await _json_object(request)
            event = body.get("event")
            event_id = event.get("event_id") if isinstance(event, dict) else None
            if not isinstance(event_id, str):
                raise ValueError("event.event_id is missing")
            invite = RemoteInvite.from_json(request.match_info["room_id"], event_id, body)
            return web.json_response((await writes.remote_invite_here(invite)).to_json())

        async def purge(request: web.Request) -> web.Response:
            options = PurgeOptions.from_json(await _json_object(request))
            result = await writes.purge_here(request.match_info["room_id"], options)
            return web.json_response(result.to_json())

        async def delete(request: web.Request) -> web.Response:
            options = PurgeOptions.from_json(await _json_object(request))
            delete_id = await writes.start_deletion_here(request.match_info["room_id"], options)
            return web.json_response({"delete_id": delete_id})

        return [
            web.post(f"{PREFIX}/rooms/{{room_id}}/purge", self._wrap("room_purge", purge)),
            web.post(f"{PREFIX}/rooms/{{room_id}}/delete", self._wrap("room_delete", delete)),
            web.post(
                f"{PREFIX}/rooms/{{room_id}}/remote_invite", self._wrap("room_remote_invite", remote_invite)
            ),
            web.post(f"{PREFIX}/rooms/{{room_id}}/send", self._wrap("room_send", send)),
            web.post(f"{PREFIX}/rooms/{{room_id}}/create", self._wrap("room_create", create)),
            web.post(f"{PREFIX}/rooms/{{room_id}}/backfill", self._wrap("room_backfill", backfill)),
        ]

    def _wrap(self, endpoint: str, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            refusal = self._check_secret(request)
            if refusal is not None:
                return refusal
            started = time.monotonic()
            try:
                response = await handler(request)
            except InternalError as e:
                response = e.response()
            except ValueError as e:  # the ops' contract: invalid IDs or values
                response = InternalError(400, "M_INVALID_PARAM", str(e).splitlines()[0]).response()
            except Exception as e:
                error = api_error_for(e)
                if error is None:
                    raise
                response = error.response()
            self.served.labels(endpoint, str(response.status)).inc()
            self.latency.labels(endpoint).observe(time.monotonic() - started)
            return response

        return guarded

    def _check_secret(self, request: web.Request) -> web.Response | None:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer" or not given:
            reason, status = "missing_secret", 401
        elif self._secret is None:
            reason, status = "no_secret_configured", 403
        elif not hmac.compare_digest(given.encode(), self._secret):
            reason, status = "wrong_secret", 403
        else:
            return None
        self.refused.labels(reason).inc()
        peer = request.remote or "?"
        self._ratelog.warning(
            f"refused:{peer}:{reason}",
            "internal request refused: reason=%s peer=%s path=%s",
            reason,
            peer,
            request.path,
        )
        return InternalError(status, WORKER_AUTH_ERRCODE, f"worker request refused ({reason})").response()

    async def _wait_positions(self, request: web.Request) -> None:
        try:
            positions = parse_positions(request.headers.get(POSITIONS_HEADER, ""))
        except ValueError as e:
            raise InternalError(400, "M_INVALID_PARAM", f"{POSITIONS_HEADER}: {e}") from None
        if positions and not await self.ops.wait_for_positions(positions, POSITION_WAIT_S):
            self.position_timeouts.inc()
            log.warning("acting before the caller's positions were seen path=%s", request.path)

    async def instance(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"instance_name": self.ops.instance_name, "instance_id": self.ops.instance_id}
        )

    async def stream_rows(self, request: web.Request) -> web.Response:
        try:
            from_token = int(request.query["from"])
            to_token = int(request.query["to"])
            limit = min(int(request.query.get("limit", "1000")), MAX_LIMIT)
        except (KeyError, ValueError):
            raise InternalError(400, "M_INVALID_PARAM", "from, to (and limit) must be integers") from None
        if limit < 1 or from_token < 0 or to_token < from_token:
            raise InternalError(400, "M_INVALID_PARAM", "need 0 <= from <= to and limit >= 1")
        answer = await self.ops.stream_rows(request.match_info["stream"], from_token, to_token, limit)
        return web.json_response(answer)

    async def typing_view(self, request: web.Request) -> web.Response:
        return web.json_response(self.ops.get_typing(request.match_info["room_id"]))

    async def typing(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        typing, timeout = body.get("typing"), body.get("timeout", 0)
        if not isinstance(typing, bool) or not isinstance(timeout, int) or isinstance(timeout, bool):
            raise InternalError(400, "M_BAD_JSON", "typing must be a boolean and timeout an integer (ms)")
        await self._wait_positions(request)
        await self.ops.set_typing(
            request.match_info["room_id"], request.match_info["user_id"], typing, timeout
        )
        return web.json_response({})

    async def put_presence(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        presence, status_msg = body.get("presence"), body.get("status_msg")
        if presence not in PRESENCE_STATES or not (status_msg is None or isinstance(status_msg, str)):
            raise InternalError(400, "M_BAD_JSON", f"presence must be one of {PRESENCE_STATES}")
        await self._wait_positions(request)
        await self.ops.set_presence(request.match_info["user_id"], str(presence), status_msg)
        return web.json_response({})

    async def get_presence(self, request: web.Request) -> web.Response:
        return web.json_response(await self.ops.get_presence(request.match_info["user_id"]))


def _same_room(request: web.Request, room_id: str) -> None:
    if request.match_info["room_id"] != room_id:
        raise ValueError("the event's room_id differs from the path's")


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise InternalError(400, "M_NOT_JSON", "the body must be JSON") from None
    if not isinstance(body, dict):
        raise InternalError(400, "M_BAD_JSON", "the body must be a JSON object")
    return body
