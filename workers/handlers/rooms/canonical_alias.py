"""A room's `m.room.canonical_alias`: the aliases it lists must lead to it.

Clients show a room's canonical alias as its address, often as its name, so a room may list only
aliases the directory maps to it: otherwise any room could present itself as another room's
`#announcements:server`. As the spec has it, the server checks the aliases an event adds; those
already in the room's current event, and those it drops, are not checked again (an alias removed
from the directory may stay listed until the room changes it). 400 `M_BAD_ALIAS`, as Synapse
answers; a value of the wrong type is 400 `M_INVALID_PARAM`, as Synapse answers it too.

Runs on the room's writer, after the room's rules: for a send, against the room's current event;
for createRoom, against the plan's events before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers import identifiers
from workers.handlers.rooms.rules import BadEvent, InvalidParam
from workers.model import NewEvent
from workers.storage import Conn, directory

CANONICAL_ALIAS_EVENT = "m.room.canonical_alias"


class BadAlias(BadEvent):
    """An alias that is not one, or that the directory does not map to the room (400 M_BAD_ALIAS)."""

    errcode = "M_BAD_ALIAS"


def is_canonical_alias(event: NewEvent) -> bool:
    return event.type == CANONICAL_ALIAS_EVENT and event.state_key == ""


def added_aliases(content: Mapping[str, Any], current: Mapping[str, Any] | None) -> list[str]:
    """The aliases `content` lists that `current` (the room's event before it, if any) did not:
    `alias` when it changed, and the new entries of `alt_aliases`. Raises InvalidParam when `alias`
    is not a string or `alt_aliases` not a list of strings."""
    before = current or {}
    added: list[str] = []
    alias = content.get("alias")
    if alias and alias != before.get("alias"):
        if not isinstance(alias, str):
            raise InvalidParam("m.room.canonical_alias's alias is a string")
        added.append(alias)
    alt_aliases = content.get("alt_aliases", [])
    if not isinstance(alt_aliases, list) or not all(isinstance(a, str) for a in alt_aliases):
        raise InvalidParam("m.room.canonical_alias's alt_aliases is a list of aliases")
    old = before.get("alt_aliases")
    listed = set(old) if isinstance(old, list) and all(isinstance(a, str) for a in old) else set()
    added += sorted(set(alt_aliases) - listed - set(added))
    return added


async def check(conn: Conn, event: NewEvent, current: Mapping[str, Any] | None) -> None:
    """Raise BadAlias unless every alias `event` adds to `current` is one the directory maps to
    the event's room (InvalidParam for a value of the wrong type)."""
    for alias in added_aliases(event.content, current):
        try:
            identifiers.check_alias(alias)
        except ValueError as e:
            raise BadAlias(f"{alias!r} is not a room alias: {e}") from None
        if await directory.room_for_alias(conn, alias) != event.room_id:
            raise BadAlias(f"room alias {alias} does not point to {event.room_id}")
