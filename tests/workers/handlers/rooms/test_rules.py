"""workers.handlers.rooms.rules: who may join, invite, leave and send."""

from __future__ import annotations

import pytest

from workers.handlers.rooms import rules as rooms
from workers.handlers.rooms.power_levels import PowerLevels
from workers.model import NewEvent

_MOD = PowerLevels.from_state({"users": {"@a:x": 100, "@b:x": 50}, "kick": 60, "state_default": 0}, None)


def _member(user: str, membership: str, sender: str | None = None) -> NewEvent:
    return NewEvent("$e", "!r", "m.room.member", sender or user, {"membership": membership}, user)


@pytest.mark.parametrize(
    ("event", "view", "error"),
    [
        (_member("@b:x", "join"), rooms.RoomView(True, "public", None, None), None),
        (_member("@b:x", "join"), rooms.RoomView(True, "invite", None, None), rooms.Forbidden),
        (_member("@b:x", "join"), rooms.RoomView(True, "invite", "invite", None), None),
        (_member("@b:x", "join", sender="@a:x"), rooms.RoomView(True, "public", "join", None),
         rooms.Forbidden),
        (_member("@b:x", "join"), rooms.RoomView(False, "public", None, None), rooms.NotFound),
        (_member("@b:x", "leave"), rooms.RoomView(True, "public", None, None), rooms.Forbidden),
        (_member("@b:x", "invite", sender="@a:x"), rooms.RoomView(True, "invite", "join", None), None),
        (_member("@b:x", "invite", sender="@a:x"), rooms.RoomView(True, "invite", None, None),
         rooms.Forbidden),
        (_member("@b:x", "dance"), rooms.RoomView(True, "public", None, None), rooms.BadEvent),
        (NewEvent("$m", "!r", "m.room.message", "@b:x", {}), rooms.RoomView(True, "public", "leave", None),
         rooms.Forbidden),
        (NewEvent("$m", "!r", "m.room.message", "@b:x", {}), rooms.RoomView(True, "public", "join", None),
         None),
        # A user-id state key is the sender's own (the spec's rule 8).
        (NewEvent("$s", "!r", "m.custom", "@b:x", {}, "@a:x"),
         rooms.RoomView(True, "public", "join", None, _MOD), rooms.Forbidden),
        (NewEvent("$s", "!r", "m.custom", "@b:x", {}, "@b:x"),
         rooms.RoomView(True, "public", "join", None, _MOD), None),
        # A member event's state key is a user id; a third-party invite needs what is not served here.
        (_member("b", "invite", sender="@a:x"), rooms.RoomView(True, "invite", "join", None), rooms.BadEvent),
        (NewEvent("$e", "!r", "m.room.member", "@a:x", {"membership": "invite", "third_party_invite": {}},
                  "@b:x"), rooms.RoomView(True, "invite", "join", None), rooms.Forbidden),
        # Rule 4.2: an authorising user's server signs the event; here only the sender's server signs.
        (NewEvent("$e", "!r", "m.room.member", "@b:x",
                  {"membership": "join", "join_authorised_via_users_server": "@s:y"}, "@b:x"),
         rooms.RoomView(True, "public", None, None), rooms.Forbidden),
        (NewEvent("$e", "!r", "m.room.member", "@a:x",
                  {"membership": "invite", "join_authorised_via_users_server": ["@s:x"]}, "@b:x"),
         rooms.RoomView(True, "invite", "join", None), rooms.BadEvent),
        (NewEvent("$e", "!r", "m.room.member", "@b:x",
                  {"membership": "join", "join_authorised_via_users_server": "@s:x"}, "@b:x"),
         rooms.RoomView(True, "public", None, None), None),
        # An unban takes the ban and the kick level (@b: ban 50 reached, kick 60 not).
        (_member("@c:x", "leave", sender="@b:x"), rooms.RoomView(True, "public", "join", "ban", _MOD),
         rooms.Forbidden),
        (_member("@c:x", "leave", sender="@a:x"), rooms.RoomView(True, "public", "join", "ban", _MOD), None),
    ],
)  # fmt: skip
def test_room_rules(event: NewEvent, view: rooms.RoomView, error: type[Exception] | None) -> None:
    if error is None:
        rooms.check(event, view)
    else:
        with pytest.raises(error):
            rooms.check(event, view)


@pytest.mark.parametrize(
    ("event", "view", "errcode"),
    [
        # A banned user joining, knocking or invited: M_BAD_STATE whoever asks (as Synapse's
        # membership handler answers, before any power level is weighed).
        (_member("@b:x", "join"), rooms.RoomView(True, "public", "ban", "ban"), "M_BAD_STATE"),
        (_member("@b:x", "knock"), rooms.RoomView(True, "knock", "ban", "ban"), "M_BAD_STATE"),
        (_member("@b:x", "invite", sender="@a:x"), rooms.RoomView(True, "invite", "join", "ban"),
         "M_BAD_STATE"),
        (_member("@b:x", "invite", sender="@c:x"), rooms.RoomView(True, "invite", None, "ban"),
         "M_BAD_STATE"),
        # The rest stays the spec's M_FORBIDDEN.
        (_member("@b:x", "invite", sender="@a:x"), rooms.RoomView(True, "invite", "join", "join"),
         "M_FORBIDDEN"),
        (_member("@b:x", "knock"), rooms.RoomView(True, "knock", "join", "join"), "M_FORBIDDEN"),
        (_member("@b:x", "join"), rooms.RoomView(True, "invite", None, None), "M_FORBIDDEN"),
    ],
)  # fmt: skip
def test_refusals_carry_synapses_errcode(event: NewEvent, view: rooms.RoomView, errcode: str) -> None:
    with pytest.raises(rooms.Forbidden) as refused:
        rooms.check(event, view)
    assert refused.value.errcode == errcode


_INVITE_50 = PowerLevels.from_state({"users": {"@a:x": 100, "@b:x": 50, "@c:x": 10}, "invite": 50}, None)


def _vouched(user: str, authoriser: str) -> NewEvent:
    return NewEvent(
        "$e", "!r", "m.room.member", user, {"membership": "join", rooms.AUTHORISING_USER: authoriser}, user
    )


def _restricted(join_rule: str, sender: str | None, authoriser: str | None) -> rooms.RoomView:
    return rooms.RoomView(True, join_rule, sender, sender, _INVITE_50, authoriser_membership=authoriser)


@pytest.mark.parametrize("join_rule", ["restricted", "knock_restricted"])
@pytest.mark.parametrize(
    ("event", "sender", "authoriser", "allowed"),
    [
        (_vouched("@d:x", "@b:x"), None, "join", True),  # joined, at the invite level
        (_vouched("@d:x", "@c:x"), None, "join", False),  # below it
        (_vouched("@d:x", "@b:x"), None, "leave", False),  # not joined
        (_member("@d:x", "join"), None, None, False),  # nobody vouches
        (_member("@d:x", "join"), "invite", None, True),  # invited: as in an invite room
        (_vouched("@d:x", "@b:x"), "ban", "join", False),
    ],
)  # fmt: skip
def test_a_restricted_join_needs_a_joined_authoriser_who_may_invite(
    join_rule: str, event: NewEvent, sender: str | None, authoriser: str | None, allowed: bool
) -> None:
    view = _restricted(join_rule, sender, authoriser)
    if allowed:
        rooms.check(event, view)
    else:
        with pytest.raises(rooms.Forbidden):
            rooms.check(event, view)


def test_knocks_and_allow_lists_of_restricted_rooms() -> None:
    rooms.check(_member("@d:x", "knock"), _restricted("knock_restricted", None, None))
    with pytest.raises(rooms.Forbidden):
        rooms.check(_member("@d:x", "knock"), _restricted("restricted", None, None))
    owner = rooms.RoomView(True, "invite", "join", None, _INVITE_50)
    for allow in ("!space:x", [["!space:x"]]):
        content = {"join_rule": "restricted", "allow": allow}
        with pytest.raises(rooms.BadEvent):
            rooms.check(NewEvent("$j", "!r", "m.room.join_rules", "@a:x", content, ""), owner)
    content = {"join_rule": "restricted", "allow": [{"type": "m.room_membership", "room_id": "!s:x"}]}
    rooms.check(NewEvent("$j", "!r", "m.room.join_rules", "@a:x", content, ""), owner)


def test_power_levels_defaults_and_tolerance() -> None:
    none_yet = PowerLevels.from_state(None, "@creator")
    assert none_yet.user("@creator") == 100 and none_yet.user("@x") == 0
    assert none_yet.required("m.room.name", True) == 0  # no power levels event: state_default 0
    odd = PowerLevels.from_state(
        {"users": {"@a:x": "75", "@b:x": True, "@c:x": [1]}, "ban": "x", "kick": 20}, None
    )
    assert odd.users == {"@a:x": 75} and odd.top["ban"] == 50 and odd.top["kick"] == 20
    assert odd.may_act_on("kick", "@a:x", "@z") is None
    assert odd.may_act_on("kick", "@z", "@a:x") is not None  # no power
    assert (
        PowerLevels.from_state({"users": {"@a:x": 50, "@b:x": 50}}, None).may_act_on("ban", "@a:x", "@b:x")
        is not None
    )


def test_a_power_levels_change_cannot_exceed_or_touch_higher_levels() -> None:
    now = PowerLevels.from_state({"users": {"@owner": 100, "@mod": 50, "@m": 0}}, None)
    assert now.may_change_to("@mod", {"users": {"@owner": 100, "@mod": 50, "@m": 50}}) is None
    assert now.may_change_to("@mod", {"users": {"@owner": 100, "@mod": 50, "@m": 60}}) is not None
    demote_owner = {"users": {"@owner": 0, "@mod": 50, "@m": 0}}
    assert now.may_change_to("@mod", demote_owner) is not None
    assert now.may_change_to("@owner", demote_owner) is None  # lowering yourself is allowed
    assert now.may_change_to("@mod", {"users": {"@owner": 100, "@mod": 50}}) is None  # @m's 0 removed


def test_a_power_levels_change_is_judged_on_the_keys_sent_not_their_defaults() -> None:
    """Rule 10.4 of room versions 10 and 11: a key added or removed is a change even when its value
    is the default it stood for; a sender below that value may not make it (Synapse's
    `_check_power_levels` and every server replaying the room refuse it)."""
    base = {"users": {"@owner": 100, "@mod": 40}, "events": {"m.room.power_levels": 40}, "ban": 50}
    now = PowerLevels.from_state(base, None)
    assert now.may_change_to("@mod", {**base, "redact": 50}) is not None  # added at its default, 50 > 40
    assert now.may_change_to("@mod", {**base, "redact": 40}) is None
    assert now.may_change_to("@mod", {k: v for k, v in base.items() if k != "ban"}) is not None  # 50 removed
    assert now.may_change_to("@mod", {**base, "notifications": {"room": 50}}) is not None
    assert now.may_change_to("@mod", {**base, "events": {"m.room.power_levels": 40, "m.x": 40}}) is None
    assert now.may_change_to("@owner", {**base, "redact": 100, "notifications": {"room": 100}}) is None
    # The room's first power levels event is not limited by any before it.
    assert PowerLevels.from_state(None, "@owner").may_change_to("@anyone", {"ban": 100}) is None


@pytest.mark.parametrize(
    ("content", "valid"),
    [
        ({"ban": 50, "users": {"@a:x": 100}, "events": {"m.x": 0}, "notifications": {"room": 50}}, True),
        ({"ban": "50"}, False),
        ({"kick": True}, False),
        ({"redact": 1.5}, False),
        ({"users": {"@a:x": "100"}}, False),
        ({"users": {"a": 100}}, False),
        ({"events": {"m.x": None}}, False),
        ({"notifications": []}, False),
    ],
)  # fmt: skip
def test_power_levels_content_holds_integers_only(content: dict[str, object], valid: bool) -> None:
    event = NewEvent("$p", "!r", "m.room.power_levels", "@a:x", content, "")
    view = rooms.RoomView(
        True, "public", "join", None, PowerLevels.from_state({"users": {"@a:x": 100}}, None)
    )
    if valid:
        rooms.check(event, view)
    else:
        with pytest.raises(rooms.BadEvent):
            rooms.check(event, view)


def test_a_room_has_one_create_event_power_levels_one_key_and_events_a_size_limit() -> None:
    """Events Synapse's own rules refuse, never stored here: a second m.room.create (rule 1: a create
    event has no prev_events), power levels under another state key, and an event over 65,536
    bytes in the federation format (the spec's size limit; Synapse answers 413 M_TOO_LARGE)."""
    owner = rooms.RoomView(
        True, "public", "join", None, PowerLevels.from_state({"users": {"@a:x": 100}}, None)
    )
    with pytest.raises(rooms.InvalidParam):
        rooms.check(NewEvent("$c", "!r", "m.room.create", "@a:x", {"room_version": "11"}, ""), owner)
    with pytest.raises(rooms.BadEvent):
        rooms.check(NewEvent("$p", "!r", "m.room.power_levels", "@a:x", {"ban": 50}, "other"), owner)
    # Its own rule (the invite level, not the state level) is for third-party invites, not served here.
    with pytest.raises(rooms.Forbidden):
        rooms.check(
            NewEvent("$t", "!r", "m.room.third_party_invite", "@a:x", {"display_name": "x"}, "tok"), owner
        )
    fits = rooms.MAX_EVENT_BYTES - 2_000
    rooms.check(NewEvent("$m", "!r", "m.room.message", "@a:x", {"body": "x" * fits}), owner)
    with pytest.raises(rooms.TooLarge):
        rooms.check(NewEvent("$m", "!r", "m.room.message", "@a:x", {"body": "x" * (fits + 1_500)}), owner)
    with pytest.raises(rooms.TooLarge):  # counted in UTF-8 bytes, not characters
        rooms.check(NewEvent("$m", "!r", "m.room.message", "@a:x", {"body": "é" * (fits // 2 + 800)}), owner)


@pytest.mark.parametrize(
    ("content", "valid"),
    [
        ({"body": "x", "n": 2**53 - 1, "m": -(2**53 - 1), "ok": True, "list": [1, "a", None]}, True),
        ({"body": "x", "n": 1.5}, False),
        ({"body": "x", "n": 1.0}, False),  # 1.0 is a float, whatever it equals
        ({"nested": [{"n": 2**53}]}, False),
        ({"nested": {"n": -(2**53)}}, False),
    ],
)  # fmt: skip
def test_event_content_is_canonical_json(content: dict[str, object], valid: bool) -> None:
    """Rooms 6 and later: no floats, integers within ±(2**53 - 1); the client API answers anything
    else 400 M_BAD_JSON (the spec's room version 6, "Canonical JSON")."""
    event = NewEvent("$m", "!r", "m.room.message", "@a:x", content)
    view = rooms.RoomView(True, "public", "join", None)
    if valid:
        rooms.check(event, view)
    else:
        with pytest.raises(rooms.BadEvent):
            rooms.check(event, view)


def test_a_call_invite_is_refused_in_a_public_room_only() -> None:
    """As Synapse answers (403): in a public room anyone could ring every member."""
    call = NewEvent("$v", "!r", "m.call.invite", "@a:x", {"call_id": "c", "version": 1, "lifetime": 60000})
    for join_rule, refused in (("public", True), ("invite", False), ("knock", False)):
        view = rooms.RoomView(
            True, join_rule, "join", None, PowerLevels.from_state({"users": {"@a:x": 100}}, None)
        )
        if refused:
            with pytest.raises(rooms.Forbidden):
                rooms.check(call, view)
        else:
            rooms.check(call, view)
