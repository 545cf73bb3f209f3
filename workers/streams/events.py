"""The `events` stream (live, positive orderings) and the `backfill` stream (historic, negative).

A row carries what a reader needs to invalidate caches and wake the right readers (room, type,
state key, membership), not the event body: readers fetch bodies from the database, which is the
truth. Wire tokens of `backfill` are positive (the negated stream ordering), see pubsub.streams.
"""

from __future__ import annotations

from collections.abc import Sequence
from json.encoder import encode_basestring

import asyncpg
from pydantic import BaseModel, ConfigDict, Field

from pubsub.streams import Stream
from pubsub.types import IdGenerator
from workers.model import Event
from workers.storage.events import events_by_writer

EVENTS = "events"
BACKFILL = "backfill"
_ID = r"^[!$@#A-Za-z0-9_.:=\-/+]{1,255}$"


class EventRow(BaseModel):
    """One event on the wire."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str = Field(pattern=_ID)
    room_id: str = Field(pattern=_ID)
    type: str = Field(min_length=1, max_length=255)
    sender: str = Field(pattern=_ID)
    state_key: str | None = Field(None, max_length=255)
    membership: str | None = Field(None, max_length=32)

    @classmethod
    def of(cls, event: Event) -> EventRow:
        """The row of a persisted event (catch-up reads them back with this)."""
        return cls(
            event_id=event.event_id, room_id=event.room_id, type=event.type, sender=event.sender,
            state_key=event.state_key, membership=event.membership,
        )  # fmt: skip


def row_json(event: Event) -> str:
    """The JSON of `EventRow.of(event)`, built as text without the model: the persister stages one
    per event, and validating a model it has just built cost about a sixth of the write path's
    CPU. What the row holds was checked when the event was accepted (the HTTP API and the room
    rules hold every field to the limits of `EventRow`; `tests/workers` checks the two agree)."""
    q = encode_basestring
    state_key = "null" if event.state_key is None else q(event.state_key)
    membership = event.membership
    return (
        f'{{"event_id":{q(event.event_id)},"room_id":{q(event.room_id)},"type":{q(event.type)},'
        f'"sender":{q(event.sender)},"state_key":{state_key},'
        f'"membership":{"null" if membership is None else q(membership)}}}'
    )


def events_stream(pool: asyncpg.Pool, generator: IdGenerator, writers: Sequence[str]) -> Stream[EventRow]:
    async def update(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, EventRow]]:
        async with pool.acquire() as conn:
            events = await events_by_writer(conn, instance, from_token, to_token, limit)
        return [(e.stream_ordering, EventRow.of(e)) for e in events]

    return Stream(EVENTS, EventRow, update, generator, writers)


def backfill_stream(pool: asyncpg.Pool, generator: IdGenerator, writers: Sequence[str]) -> Stream[EventRow]:
    async def update(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, EventRow]]:
        async with pool.acquire() as conn:
            events = await events_by_writer(conn, instance, -from_token, -to_token, limit)
        return [(-e.stream_ordering, EventRow.of(e)) for e in events]

    return Stream(BACKFILL, EventRow, update, generator, writers, positive=False)
