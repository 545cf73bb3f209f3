"""The `events` stream (live, positive orderings) and the `backfill` stream (historic, negative).

A row carries what a reader needs to invalidate caches and wake the right readers (room, type,
state key, membership), to render the room's events (its version) and, for a redaction, to drop
the body of the event it redacts (`redacts`), not the event body: readers fetch bodies from the
database, which is the truth. Wire tokens of `backfill` are
positive (the negated stream ordering), see pubsub.streams.

A room that moved to another writer (`workers.handlers.placement.room_leases`): the new writer's events of
the room carry `after`, the old writer and its last event there (`room_handovers`), on the live row
and on the row the update function reads back; readers apply the old writer's rows up to it first
(`pubsub.streams`, dependencies), so the room's events stay in stream order for every reader.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, NamedTuple

import asyncpg
from pydantic import Field

from pubsub.streams import Stream
from pubsub.types import IdGenerator
from workers.model import REDACTION_EVENT, ROW_ID_PATTERN, Event, redacts_of
from workers.storage.events import events_by_writer
from workers.storage.handovers import after_of, handovers_to
from workers.storage.rooms import room_versions
from workers.streams.handovers import Afters

EVENTS = "events"
BACKFILL = "backfill"
_Id = Annotated[str, Field(pattern=ROW_ID_PATTERN)]


class EventRow(NamedTuple):
    """One event on the wire (see pubsub.streams for how rows are validated)."""

    event_id: _Id
    room_id: _Id
    type: Annotated[str, Field(min_length=1, max_length=255)]
    sender: _Id
    state_key: Annotated[str | None, Field(max_length=255)] = None
    membership: Annotated[str | None, Field(max_length=32)] = None
    #: The room's version: a reader renders the room's events with its rules.
    room_version: Annotated[str | None, Field(pattern=r"^[a-z0-9.\-]{1,32}$")] = None
    #: For an m.room.redaction, the event it redacts: readers drop its cached body. (Trailing and
    #: optional: the writer leaves it out of every other row.)
    redacts: _Id | None = None
    #: The room moved to this row's writer after `after` = ((old writer, its last event in the
    #: room),): readers apply the old writer's rows up to there first. (Trailing and optional.)
    after: Afters | None = None

    @classmethod
    def of(cls, event: Event, room_version: str | None, after: tuple[str, int] | None = None) -> EventRow:
        """The row of a persisted event (catch-up reads them back with this)."""
        return cls(
            event.event_id, event.room_id, event.type, event.sender, event.state_key, event.membership,
            room_version, redacts_of(event.type, event.content), None if after is None else (after,),
        )  # fmt: skip


def row_json(event: Event, room_version: str | None) -> str:
    """The JSON of `EventRow.of(event, room_version)` (see `Event.json_texts`, which the persister
    uses to build it together with the stored JSON). What the row holds was checked when the event
    was accepted (the HTTP API and the room rules hold every field to the limits of `EventRow`;
    `tests/workers` checks that readers accept it and get the same row)."""
    return event.json_texts(room_version)[1]


def with_after(event: Event, row: str, after: tuple[str, int]) -> str:
    """`row` (the event's row JSON from `row_json`) with its `after` field set (and `redacts`,
    which comes before it, as null when the row left it out)."""
    redacts = redacts_of(event.type, event.content) if event.type == REDACTION_EVENT else None
    return f"{row[:-1]}{'' if redacts is not None else ',null'},[[{json.dumps(after[0])},{after[1]}]]]"


def events_stream(pool: asyncpg.Pool, generator: IdGenerator, writers: Sequence[str]) -> Stream[EventRow]:
    async def update(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, EventRow]]:
        async with pool.acquire() as conn:
            events = await events_by_writer(conn, instance, from_token, to_token, limit)
            rooms = list({e.room_id for e in events})
            versions = await room_versions(conn, rooms)
            moved = await handovers_to(conn, instance, rooms, events[-1].stream_ordering) if events else {}
        rows = []
        for e in events:
            after = after_of(moved, e.room_id, e.stream_ordering)
            rows.append((e.stream_ordering, EventRow.of(e, versions.get(e.room_id), after)))
        return rows

    return Stream(EVENTS, EventRow, update, generator, writers, dependency_field="after")


def backfill_stream(pool: asyncpg.Pool, generator: IdGenerator, writers: Sequence[str]) -> Stream[EventRow]:
    async def update(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, EventRow]]:
        async with pool.acquire() as conn:
            events = await events_by_writer(conn, instance, -from_token, -to_token, limit)
            versions = await room_versions(conn, list({e.room_id for e in events}))
        return [(-e.stream_ordering, EventRow.of(e, versions.get(e.room_id))) for e in events]

    return Stream(BACKFILL, EventRow, update, generator, writers, positive=False)
