"""workers.handlers.rooms: who may join, invite, leave and send."""

from __future__ import annotations

import pytest

from workers.handlers import rooms
from workers.model import NewEvent


def _member(user: str, membership: str, sender: str | None = None) -> NewEvent:
    return NewEvent("$e", "!r", "m.room.member", sender or user, {"membership": membership}, user)


@pytest.mark.parametrize(
    ("event", "view", "error"),
    [
        (_member("@b", "join"), rooms.RoomView(True, "public", None, None), None),
        (_member("@b", "join"), rooms.RoomView(True, "invite", None, None), rooms.Forbidden),
        (_member("@b", "join"), rooms.RoomView(True, "invite", "invite", None), None),
        (_member("@b", "join", sender="@a"), rooms.RoomView(True, "public", "join", None), rooms.Forbidden),
        (_member("@b", "join"), rooms.RoomView(False, "public", None, None), rooms.NotFound),
        (_member("@b", "leave"), rooms.RoomView(True, "public", None, None), rooms.Forbidden),
        (_member("@b", "invite", sender="@a"), rooms.RoomView(True, "invite", "join", None), None),
        (_member("@b", "invite", sender="@a"), rooms.RoomView(True, "invite", None, None), rooms.Forbidden),
        (_member("@b", "dance"), rooms.RoomView(True, "public", None, None), rooms.BadEvent),
        (NewEvent("$m", "!r", "m.room.message", "@b", {}), rooms.RoomView(True, "public", "leave", None),
         rooms.Forbidden),
        (NewEvent("$m", "!r", "m.room.message", "@b", {}), rooms.RoomView(True, "public", "join", None),
         None),
    ],
)  # fmt: skip
def test_room_rules(event: NewEvent, view: rooms.RoomView, error: type[Exception] | None) -> None:
    if error is None:
        rooms.check(event, view)
    else:
        with pytest.raises(error):
            rooms.check(event, view)
