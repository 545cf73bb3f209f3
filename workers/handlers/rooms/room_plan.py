"""createRoom's plan: the room's first events, in the spec's order, from a request body.

Every planned event after the creator's join is checked by the room's rules (`rules.check`) against
the state the planned events before it leave, before any of the room is written: `initial_state`
and the power levels override hold anything a client sent, and the room's writer persists the plan
as one batch, holding the whole room.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers import identifiers
from workers.handlers.rooms import history_visibility
from workers.handlers.rooms.power_levels import PowerLevels
from workers.handlers.rooms.rules import (
    JOIN_RULES_EVENT,
    POWER_LEVELS_EVENT,
    BadEvent,
    RoomView,
    UnsupportedRoomVersion,
    check,
    fits,
    new_event_id,
    one_of,
    well_formed,
)
from workers.model import CREATE_EVENT, DEFAULT_ROOM_VERSION, MEMBER_EVENT, SUPPORTED_ROOM_VERSIONS, NewEvent

#: createRoom presets: (join rule, guest access).
PRESETS = {
    "private_chat": ("invite", "can_join"),
    "trusted_private_chat": ("invite", "can_join"),
    "public_chat": ("public", "forbidden"),
}


@dataclass(frozen=True, slots=True)
class RoomPlan:
    """What createRoom will write: the room's first events, in order, and the alias to claim."""

    room_id: str
    events: list[NewEvent]
    alias: str | None


def _object(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key, {})
    if not isinstance(value, dict):
        raise BadEvent(f"{key} must be an object")
    return value


def plan_room(
    body: dict[str, Any],
    creator: str,
    room_id: str,
    server_name: str,
    default_version: str = DEFAULT_ROOM_VERSION,
) -> RoomPlan:
    """The events of a createRoom request body (the spec's order: create, the creator's join, power
    levels, alias, preset, initial_state, name, topic, invites). Raises BadEvent."""
    visibility = body.get("visibility", "private")
    if visibility not in ("public", "private"):
        raise BadEvent("visibility must be public or private")
    preset = body.get("preset", "public_chat" if visibility == "public" else "private_chat")
    if not one_of(preset, PRESETS):
        raise BadEvent(f"preset must be one of {sorted(PRESETS)}")
    version = body.get("room_version", default_version)
    if version not in SUPPORTED_ROOM_VERSIONS:
        raise UnsupportedRoomVersion(
            f"room version {version!r} is not one of {list(SUPPORTED_ROOM_VERSIONS)}"
        )
    invites = body.get("invite", [])
    if not isinstance(invites, list) or not all(isinstance(u, str) for u in invites):
        raise BadEvent("invite must be a list of user ids")
    for user in invites:
        try:
            identifiers.check_user_id(user)
        except ValueError as e:
            raise BadEvent(str(e)) from None
    initial = body.get("initial_state", [])
    if not isinstance(initial, list) or not all(
        isinstance(e, dict)
        and isinstance(e.get("type"), str)
        and isinstance(e.get("state_key", ""), str)
        and isinstance(e.get("content"), dict)
        for e in initial
    ):
        raise BadEvent("initial_state must be a list of {type, state_key, content}")
    create_content = {**_object(body, "creation_content"), "room_version": version}
    if version != "11":
        create_content["creator"] = creator
    join_rule, guest_access = PRESETS[preset]
    users = {creator: 100}
    if preset == "trusted_private_chat":
        users |= {user: 100 for user in invites if user != creator}
    power = {
        "users": users, "users_default": 0, "events_default": 0, "state_default": 50,
        "ban": 50, "kick": 50, "redact": 50, "invite": 0, "notifications": {"room": 50},
        "events": {
            "m.room.name": 50, "m.room.power_levels": 100, "m.room.history_visibility": 100,
            "m.room.canonical_alias": 50, "m.room.avatar": 50, "m.room.tombstone": 100,
            "m.room.server_acl": 100, "m.room.encryption": 100,
        },
        **_object(body, "power_level_content_override"),
    }  # fmt: skip
    alias = None
    alias_name = body.get("room_alias_name")
    if alias_name is not None:
        if not isinstance(alias_name, str):
            raise BadEvent("room_alias_name must be a string")
        try:
            alias = identifiers.check_alias(f"#{alias_name}:{server_name}")
        except ValueError as e:
            raise BadEvent(str(e)) from None

    def state(kind: str, content: dict[str, Any], key: str = "", sender: str = creator) -> NewEvent:
        return NewEvent(new_event_id(), room_id, kind, sender, content, key)

    overridden = {(e["type"], e.get("state_key", "")): e["content"] for e in initial}
    events = [
        state(CREATE_EVENT, create_content),
        state(MEMBER_EVENT, {"membership": "join"}, creator),
        state(POWER_LEVELS_EVENT, overridden.pop((POWER_LEVELS_EVENT, ""), power)),
    ]
    if alias is not None:
        events.append(state("m.room.canonical_alias", {"alias": alias}))
    for kind, content in (
        (JOIN_RULES_EVENT, {"join_rule": join_rule}),
        ("m.room.history_visibility", {"history_visibility": history_visibility.DEFAULT}),  # every preset
        ("m.room.guest_access", {"guest_access": guest_access}),
    ):
        if (kind, "") not in overridden:
            events.append(state(kind, content))
    for (kind, key), content in overridden.items():
        if kind in (CREATE_EVENT, MEMBER_EVENT):
            raise BadEvent(f"initial_state may not hold {kind}")
        events.append(state(kind, content, key))
    for key, kind, field_name in (("name", "m.room.name", "name"), ("topic", "m.room.topic", "topic")):
        value = body.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise BadEvent(f"{key} must be a string")
            events.append(state(kind, {field_name: value}))
    is_direct = body.get("is_direct") is True
    for user in dict.fromkeys(u for u in invites if u != creator):  # the creator is joined already
        invite: dict[str, Any] = {"membership": "invite"}
        if is_direct:
            invite["is_direct"] = True
        events.append(state(MEMBER_EVENT, invite, user))
    _check_in_order(events, creator)
    return RoomPlan(room_id, events, alias)


def _check_in_order(events: list[NewEvent], creator: str) -> None:
    """Raise as `rules.check` does unless every planned event after the creator's join is allowed by
    the state the planned events before it leave. Synapse authorizes createRoom's events so and
    refuses the room; a power levels override or an `initial_state` can take from the creator the
    power the later events need (a state level over 100, the creator left out of `users`)."""
    fits(events[0])  # creation_content is the client's too
    well_formed(events[1])
    power, join_rule = PowerLevels.from_state(None, creator), "invite"
    for event in events[2:]:
        check(event, RoomView(True, join_rule, "join", None, power))
        if event.type == POWER_LEVELS_EVENT:
            power = PowerLevels.from_state(event.content, creator)
        elif event.type == JOIN_RULES_EVENT:
            join_rule = event.content["join_rule"]
