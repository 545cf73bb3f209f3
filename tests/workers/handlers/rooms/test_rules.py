"""workers.handlers.rooms.rules: who may join, invite, leave and send."""

from __future__ import annotations

import pytest

from workers.handlers.rooms import rules as rooms
from workers.handlers.rooms.power_levels import PowerLevels
from workers.model import NewEvent

_MOD = PowerLevels.from_state({"users": {"@a": 100, "@b": 50}, "kick": 60, "state_default": 0}, None)


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
        # A user-id state key is the sender's own (the spec's rule 8).
        (NewEvent("$s", "!r", "m.custom", "@b", {}, "@a"), rooms.RoomView(True, "public", "join", None, _MOD),
         rooms.Forbidden),
        (NewEvent("$s", "!r", "m.custom", "@b", {}, "@b"), rooms.RoomView(True, "public", "join", None, _MOD),
         None),
        # An unban takes the ban and the kick level (@b: ban 50 reached, kick 60 not).
        (_member("@c", "leave", sender="@b"), rooms.RoomView(True, "public", "join", "ban", _MOD),
         rooms.Forbidden),
        (_member("@c", "leave", sender="@a"), rooms.RoomView(True, "public", "join", "ban", _MOD), None),
    ],
)  # fmt: skip
def test_room_rules(event: NewEvent, view: rooms.RoomView, error: type[Exception] | None) -> None:
    if error is None:
        rooms.check(event, view)
    else:
        with pytest.raises(error):
            rooms.check(event, view)


def test_power_levels_defaults_and_tolerance() -> None:
    none_yet = PowerLevels.from_state(None, "@creator")
    assert none_yet.user("@creator") == 100 and none_yet.user("@x") == 0
    assert none_yet.required("m.room.name", True) == 0  # no power levels event: state_default 0
    odd = PowerLevels.from_state({"users": {"@a": "75", "@b": True, "@c": [1]}, "ban": "x", "kick": 20}, None)
    assert odd.users == {"@a": 75} and odd.top["ban"] == 50 and odd.top["kick"] == 20
    assert odd.may_act_on("kick", "@a", "@z") is None
    assert odd.may_act_on("kick", "@z", "@a") is not None  # no power
    assert (
        PowerLevels.from_state({"users": {"@a": 50, "@b": 50}}, None).may_act_on("ban", "@a", "@b")
        is not None
    )


def test_a_power_levels_change_cannot_exceed_or_touch_higher_levels() -> None:
    now = PowerLevels.from_state({"users": {"@owner": 100, "@mod": 50, "@m": 0}}, None)
    mod_raises_member = PowerLevels.from_state({"users": {"@owner": 100, "@mod": 50, "@m": 50}}, None)
    assert now.may_change_to("@mod", mod_raises_member) is None
    too_high = PowerLevels.from_state({"users": {"@owner": 100, "@mod": 50, "@m": 60}}, None)
    assert now.may_change_to("@mod", too_high) is not None
    demote_owner = PowerLevels.from_state({"users": {"@owner": 0, "@mod": 50, "@m": 0}}, None)
    assert now.may_change_to("@mod", demote_owner) is not None
    assert now.may_change_to("@owner", demote_owner) is None  # lowering yourself is allowed
