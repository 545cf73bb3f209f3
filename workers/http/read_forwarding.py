"""Reads on a worker that serves none: relayed to a worker that does, so any worker serves any request.

A worker with `serve_reads: false` keeps no replicated view, so `/sync`, room state, `/messages`,
`/event` and `joined_members` are relayed to a reading worker's client API: the same method, path
and query, the client's own `Authorization` header (the reader authenticates the client itself),
and the worker-request headers `X-Fanout-Forwarded-By` and `X-Fanout-Positions`. The reader first
waits, at most `POSITION_WAIT_S`, until it has seen the positions of the relaying worker, so a
client that sends and then reads on the same worker sees its own event. The reader's answer,
success or error, goes back to the client unchanged.

Which reader: `read_workers` (names in `instance_map`), else every other instance in `instance_map`;
a client's token always starts at the same one (its caches stay warm), the next ones are tried
when it is unavailable. A worker that serves no reads itself answers a relayed read with 421
`IO.FANOUT.NO_READS` (never relayed twice), and is asked last from then on. A relay, whichever
readers it tries, takes at most the client's `timeout` (a long-poll's) plus
`worker_request_timeout_s`; when no reader answers, the client gets
503 `M_UNKNOWN` with `Retry-After` (as for an unavailable writer) and retries.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiohttp import web

from workers.handlers.placement.forwarding import ForwardRefused, OwnerUnavailable
from workers.http.errors import ApiError
from workers.http.requests import POSITIONS_HEADER, WorkerRequests, parse_positions

log = logging.getLogger(__name__)
FORWARDED_HEADER = "X-Fanout-Forwarded-By"
NO_READS_ERRCODE = "IO.FANOUT.NO_READS"
#: Misdirected Request: the worker that got a relayed read serves none either.
NO_READS_STATUS = 421
#: Below `worker_request_timeout_s` (5 s by default), so the relayer never gives up first.
POSITION_WAIT_S = 2.0
#: The headers of a client's request that the reader needs (the token may also be in the query).
CLIENT_HEADERS = ("Authorization", "User-Agent")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: (positions, within_s) -> True when all were seen in time.
PositionWait = Callable[[Mapping[tuple[str, str], int], float], Awaitable[bool]]
#: A request -> the longest a relay of it may take (a long-poll's timeout plus the request's own).
RelayTime = Callable[[web.Request], float]


class ReadRouting:
    """Wraps the read routes: serves them here, or relays them when this worker serves no reads.

    `requests` and `wait_for_positions` are set once the worker has built its worker requests."""

    def __init__(
        self,
        name: str,
        serves_reads: bool,
        readers: Sequence[str],
        request_timeout_s: float,
    ) -> None:
        self.name = name
        self.serves_reads = serves_reads
        self.readers = [r for r in readers if r != name]
        self.request_timeout_s = request_timeout_s
        self.requests: WorkerRequests | None = None
        self.wait_for_positions: PositionWait | None = None
        self._not_readers: set[str] = set()

    def route(self, route: web.RouteDef, relay_time: RelayTime | None = None) -> web.RouteDef:
        """`route` with its handler wrapped (see the module's docstring)."""
        return web.RouteDef(route.method, route.path, self.wrap(route.handler, relay_time), route.kwargs)

    def wrap(self, handler: Handler, relay_time: RelayTime | None = None) -> Handler:
        async def read(request: web.Request) -> web.StreamResponse:
            relayed = FORWARDED_HEADER in request.headers
            if self.serves_reads:
                if relayed:
                    await self._catch_up(request)
                return await handler(request)
            if relayed:
                raise ApiError(
                    NO_READS_STATUS, NO_READS_ERRCODE, f"{self.name} serves no reads (serve_reads: false)"
                )
            limit = self.request_timeout_s + (relay_time(request) if relay_time is not None else 0.0)
            return await self.relay(request, limit)

        return read

    def candidates(self, key: str) -> list[str]:
        """The readers to try for a client, in order: its own first, those known not to read last."""
        readers = self.readers or [n for n in self._known() if n != self.name]
        if not readers:
            return []
        start = zlib.crc32(key.encode()) % len(readers)
        ordered = readers[start:] + readers[:start]
        return [r for r in ordered if r not in self._not_readers] + [
            r for r in ordered if r in self._not_readers
        ]

    def _known(self) -> list[str]:
        return sorted(self.requests.instance_map) if self.requests is not None else []

    async def relay(self, request: web.Request, limit_s: float) -> web.Response:
        headers = {h: request.headers[h] for h in CLIENT_HEADERS if h in request.headers}
        headers[FORWARDED_HEADER] = self.name
        key = request.headers.get("Authorization") or request.query.get("access_token", "")
        last: OwnerUnavailable | None = None
        deadline = time.monotonic() + limit_s  # for all the readers tried, not each
        for reader in self.candidates(key):
            remaining = deadline - time.monotonic()
            if self.requests is None or remaining <= 0:
                break
            try:
                answer = await self.requests.relay(
                    reader, request.method, request.raw_path, headers, remaining
                )
            except ForwardRefused as e:
                if e.status == NO_READS_STATUS and e.body.get("errcode") == NO_READS_ERRCODE:
                    if reader not in self._not_readers:
                        log.warning("read relay: %s serves no reads; not asking it first again", reader)
                    self._not_readers.add(reader)
                    continue
                return web.json_response(e.body, status=e.status)
            except OwnerUnavailable as e:
                last = e
                continue
            self._not_readers.discard(reader)
            return web.json_response(answer)
        why = str(last) if last is not None else "none of instance_map serves reads"
        raise OwnerUnavailable(
            "a reading worker",
            f"{self.name} has serve_reads: false and relays reads to read_workers or instance_map: {why}",
        )

    async def _catch_up(self, request: web.Request) -> None:
        """Before serving a relayed read: until this worker has seen what the relaying one had."""
        if self.wait_for_positions is None:
            return
        try:
            positions = parse_positions(request.headers.get(POSITIONS_HEADER, ""))
        except ValueError as e:
            raise ApiError(400, "M_INVALID_PARAM", f"{POSITIONS_HEADER}: {e}") from None
        if positions and not await self.wait_for_positions(positions, POSITION_WAIT_S):
            log.warning("relayed read served before the relaying worker's positions were seen")
