"""Filling a limited timeline's gap as a Matrix client does: a /sync answer whose room timeline
says `limited: true` left out events before its first one; the client pages back with
`GET /rooms/{room}/messages?dir=b&from=<prev_batch>&to=<its since>` until the server has no more
(no `end`), which brings it back to where its previous answer ended. The events so fetched, oldest
first, belong to that answer's window, before the room's timeline: the history check
(`workers.harness.history`) then reads them like the timeline's and keeps "each event exactly once,
in order per room" for every reader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from workers.harness.cluster_client import ClusterClient, RequestRefused

#: Events asked for per /messages page, and pages per gap at most (bounded: a gap that does not
#: end within them is reported unfilled, and the check says so).
PAGE_LIMIT = 50
MAX_PAGES = 40
#: Attempts of one page when the worker is away (a fault scenario), 0.2 s apart, rotating workers.
ATTEMPTS = 150


def limited_rooms(body: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(room, prev_batch or None) of every joined or left room whose timeline says `limited`."""
    out: list[tuple[str, str | None]] = []
    for section in ("join", "leave"):
        for room_id, room in body.get("rooms", {}).get(section, {}).items():
            timeline = room.get("timeline", {})
            if timeline.get("limited"):
                prev = timeline.get("prev_batch")
                out.append((room_id, prev if isinstance(prev, str) else None))
    return out


async def fill_gap(
    client: ClusterClient, workers: Sequence[str], room_id: str, prev_batch: str, since: str
) -> tuple[str, ...] | None:
    """The ids of the events between `since` and `prev_batch` in `room_id`, oldest first, read
    with /messages through `workers` (the first that answers); None when the gap did not end
    within MAX_PAGES pages or no worker answered."""
    newest_first: list[str] = []
    token = prev_batch
    for _ in range(MAX_PAGES):
        page = await _page(client, workers, room_id, token, since)
        if page is None:
            return None
        newest_first += [str(e["event_id"]) for e in page.get("chunk", [])]
        end = page.get("end")
        if not isinstance(end, str) or not page.get("chunk"):
            return tuple(reversed(newest_first))
        token = end
    return None


async def _page(
    client: ClusterClient, workers: Sequence[str], room_id: str, token: str, since: str
) -> dict[str, Any] | None:
    for attempt in range(ATTEMPTS):
        worker = workers[attempt % len(workers)]
        try:
            return await client.messages(
                room_id, via=worker, dir="b", limit=PAGE_LIMIT, to=since, **{"from": token}
            )
        except (RequestRefused, aiohttp.ClientError, TimeoutError) as e:
            if isinstance(e, RequestRefused) and e.status < 500:
                raise
            await asyncio.sleep(0.2)
    return None
