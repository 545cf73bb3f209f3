"""The `presence` stream: one row per change of a user's presence, kept in memory by its writer.

In memory like typing (`workers.streams.memory`), not in a table: presence is rebuilt from the
sync workers' USER_SYNC re-sends, which a restarted writer's stream reset triggers on each of them,
and the same HTTP catch-up then serves both ephemeral streams. The cost: a status message set with
`set_presence` is lost when the presence writer restarts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import Field, TypeAdapter

from pubsub.streams import Stream
from pubsub.types import IdGenerator, UpdateFunction

PRESENCE = "presence"
PresenceState = Literal["online", "unavailable", "offline"]
PRESENCE_STATES: tuple[PresenceState, ...] = ("online", "unavailable", "offline")


class PresenceRow(NamedTuple):
    """A user's presence after a change."""

    user_id: Annotated[str, Field(pattern=r"^@[A-Za-z0-9_.=:\-/+\[\]]{1,255}$")]
    presence: PresenceState
    last_active_ts: Annotated[int, Field(ge=0)]
    status_msg: Annotated[str | None, Field(max_length=1000)]
    currently_active: bool


def presence_stream(
    generator: IdGenerator, writers: Sequence[str], update: UpdateFunction
) -> Stream[PresenceRow]:
    return Stream(PRESENCE, PresenceRow, update, generator, writers)


_ROW = TypeAdapter(PresenceRow)


def presence_row(values: Sequence[Any]) -> PresenceRow:
    """A checked row (the limits readers hold RDATA to); raises ValueError (pydantic's)."""
    return _ROW.validate_python(tuple(values), strict=True)
