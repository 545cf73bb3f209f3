"""The part of a Matrix sync filter the cluster applies: which rooms, and how many timeline events.

A filter arrives inline (`filter={...}` JSON) or as the id of one uploaded with
`POST /user/{userId}/filter`. Fields the cluster does not apply are accepted and ignored, as the
spec allows a server to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Timeline events per room when no filter says otherwise.
DEFAULT_TIMELINE_LIMIT = 20
MAX_TIMELINE_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class SyncFilter:
    timeline_limit: int = DEFAULT_TIMELINE_LIMIT
    rooms: frozenset[str] | None = None
    not_rooms: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, body: Any) -> SyncFilter:
        """Raises ValueError naming the field that is wrong."""
        if not isinstance(body, dict):
            raise ValueError("a filter is a JSON object")
        room = _object(body, "room")
        timeline = _object(room, "timeline", "room.")
        limit = timeline.get("limit", DEFAULT_TIMELINE_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError("room.timeline.limit must be a whole number >= 0")
        rooms = room.get("rooms")
        not_rooms = room.get("not_rooms", [])
        for name, value in (("rooms", rooms), ("not_rooms", not_rooms)):
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(r, str) for r in value)
            ):
                raise ValueError(f"room.{name} must be a list of room ids")
        return cls(
            min(limit, MAX_TIMELINE_LIMIT),
            None if rooms is None else frozenset(rooms),
            frozenset(not_rooms),
        )

    def includes(self, room_id: str) -> bool:
        return room_id not in self.not_rooms and (self.rooms is None or room_id in self.rooms)


def _object(body: dict[str, Any], key: str, where: str = "") -> dict[str, Any]:
    value = body.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"{where}{key} must be an object")
    return value
