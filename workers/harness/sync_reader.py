"""One user's /sync loop under load: it long-polls (switching between sync workers, tokens carry
over), records each answer as the history check reads it (`workers.harness.history.SyncRecord`:
timelines, its own invites and knocks, the sections each room was listed in, receipts, the
device's key count, the timelines that said `limited` and the events fetched with /messages to
fill their gaps, `workers.harness.gap_fill`) and keeps what the load needs of it (the last event
seen per room, arrival times). A reader may start over when its token is refused, counting it
(the upgrade check's clients). It ends with a sync begun after the load stopped that is caught up
with every writer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from workers.harness.cluster_client import (
    ClusterClient,
    RequestRefused,
    pending_events,
    receipts_seen,
    room_sections,
    timeline_events,
)
from workers.harness.gap_fill import fill_gap, limited_rooms
from workers.harness.history import SyncRecord


class SyncReader:
    """One user's sync loop: long-polls until told to stop and caught up with `target`."""

    def __init__(
        self,
        client: ClusterClient,
        workers: Sequence[str],
        switch_every: int,
        pause_s: float = 0.0,
        start_over: bool = False,
    ) -> None:
        self.client = client
        self.workers = list(workers)
        self.switch_every = switch_every
        #: A pause before each sync (a slow client): its windows hold several changes.
        self.pause_s = pause_s
        self.records: list[SyncRecord] = []
        self.arrivals: dict[str, float] = {}
        self.typing_seen = self.presence_seen = 0
        self.failed_syncs = 0
        #: A /sync answered 4xx (its token or session refused): with `start_over` the reader starts
        #: over with an initial sync, as a client would, and notes the refusal here; without, raises.
        self.start_over = start_over
        self.start_overs: list[str] = []
        self.internal_errors = 0
        self.token: str | None = None
        #: room -> the last event this reader saw there (what its user's receipts point at).
        self.latest: dict[str, str] = {}
        #: Limited timelines whose gap /messages did not fill: why (the history check reports each).
        self.gap_failures: list[str] = []

    async def initial(self) -> None:
        self.token = (await self.client.sync(self.workers[0]))["next_batch"]

    async def run(self, stop: asyncio.Event, caught_up: Callable[[str], bool], timeout_ms: int) -> None:
        assert self.token is not None
        count = 0
        # Ends with a sync begun after the load stopped (its key counts are final) that is caught up.
        finished = False
        while not (finished and self.token is not None and caught_up(self.token)):
            worker = self.workers[(count // self.switch_every) % len(self.workers)]
            count += 1
            stopping = stop.is_set()
            if not stopping:
                await self._pause(stop)
            since = self.token
            try:
                result = await self.client.sync(worker, since, timeout_ms if not stopping else 200)
            except (RequestRefused, aiohttp.ClientError, TimeoutError) as e:
                if isinstance(e, RequestRefused) and e.status < 500:
                    if not self.start_over or since is None:
                        raise
                    self.start_overs.append(f"{worker} answered {e.status} {e.errcode or ''}".rstrip())
                    self.token = None  # the next sync is an initial one, retried like any other
                    continue
                # A worker or its database is down (a fault scenario): ask again, same token.
                self.failed_syncs += 1
                self.internal_errors += isinstance(e, RequestRefused) and e.status == 500
                await asyncio.sleep(0.2)
                continue
            if since is None:  # the start-over's initial sync: outside the checked history
                self.token = result["next_batch"]
                continue
            now = time.time()
            events = timeline_events(result) + pending_events(result)
            ids = tuple(e["event_id"] for e in events)
            for event in events:
                self.arrivals.setdefault(event["event_id"], now)
            for event in timeline_events(result):
                self.latest[event["room_id"]] = event["event_id"]
            limited = limited_rooms(result)
            filled = await self._fill_gaps(worker, since, limited)
            self.records.append(
                SyncRecord(
                    worker, since, result["next_batch"], ids,
                    tuple(e["type"] for e in result["account_data"]["events"]),
                    tuple(str(e["content"].get("msg")) for e in result["to_device"]["events"]),
                    tuple(result["device_lists"]["changed"]), tuple(room_sections(result)),
                    tuple(receipts_seen(result)),
                    result.get("device_one_time_keys_count", {}).get("signed_curve25519"),
                    tuple((room, prev is not None) for room, prev in limited), filled,
                )
            )  # fmt: skip
            self._answered(result)
            self.typing_seen += sum(
                1
                for room in result["rooms"]["join"].values()
                for e in room["ephemeral"]["events"]
                if e["type"] == "m.typing"
            )
            self.presence_seen += len(result["presence"]["events"])
            self.token = result["next_batch"]
            finished = stopping

    def _answered(self, body: dict[str, Any]) -> None:
        """Each recorded answer, for what a kind of reader counts of it."""

    async def _pause(self, stop: asyncio.Event) -> None:
        """Before each sync of the load (not of the catch-up after it): the slow client's pause."""
        if self.pause_s:
            await asyncio.sleep(self.pause_s)

    async def _fill_gaps(
        self, worker: str, since: str, limited: list[tuple[str, str | None]]
    ) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Each limited timeline's gap, filled with /messages back to `since` as a client does;
        a gap that could not be filled is left out (the history check reports it) and noted."""
        filled: list[tuple[str, tuple[str, ...]]] = []
        workers = [worker, *(w for w in self.workers if w != worker)]
        for room_id, prev_batch in limited:
            if prev_batch is None:
                continue
            try:
                ids = await fill_gap(self.client, workers, room_id, prev_batch, since)
            except RequestRefused as e:
                self.gap_failures.append(f"{room_id}: /messages answered {e.status} {e.errcode or ''}")
                continue
            if ids is None:
                self.gap_failures.append(f"{room_id}: /messages did not reach the gap's end")
                continue
            filled.append((room_id, ids))
        return tuple(filled)
