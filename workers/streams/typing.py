"""The `typing` stream: one row per change of a room's typing users, kept in memory by its writer.

A row carries the room's full new list of typing users (it replaces the previous one), so rows are
idempotent and a snapshot is just one row per room. Tokens and catch-up: `workers.streams.memory`;
readers fetch missed rows from the writer with the update function they are given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any, NamedTuple

from pydantic import Field, TypeAdapter

from pubsub.streams import Stream
from pubsub.types import IdGenerator, UpdateFunction

TYPING = "typing"
_Id = Annotated[str, Field(pattern=r"^[!@A-Za-z0-9_.:=\-/+]{1,255}$")]


class TypingRow(NamedTuple):
    """The users typing in a room after a change (empty: nobody any more)."""

    room_id: _Id
    user_ids: Annotated[tuple[_Id, ...], Field(max_length=1000)]


def typing_stream(
    generator: IdGenerator, writers: Sequence[str], update: UpdateFunction
) -> Stream[TypingRow]:
    return Stream(TYPING, TypingRow, update, generator, writers)


_ROW = TypeAdapter(TypingRow)


def typing_row(room_id: Any, user_ids: Iterable[Any]) -> TypingRow:
    """A checked row (the limits readers hold RDATA to); raises ValueError (pydantic's)."""
    return _ROW.validate_python((room_id, tuple(user_ids)), strict=True)
