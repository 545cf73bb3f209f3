"""Room writes as they travel between workers: a forwarded event, the answer that says where it
landed (`Written`), and a remote server's invite (`RemoteInvite`). Each parses a worker request's
body and refuses a malformed one with ValueError or `OwnerUnavailable`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.handlers.placement.forwarding import OwnerUnavailable
from workers.model import MEMBER_EVENT, Event, NewEvent

#: Stripped state events a remote invite may carry.
MAX_INVITE_STATE = 50


@dataclass(frozen=True, slots=True)
class Written:
    """Where an event landed."""

    event_id: str
    stream_ordering: int
    instance_name: str

    @classmethod
    def of(cls, event: Event) -> Written:
        return cls(event.event_id, event.stream_ordering, event.instance_name)

    def to_json(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "stream_ordering": self.stream_ordering,
            "instance_name": self.instance_name,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Written:
        event_id, ordering, instance = (
            body.get("event_id"),
            body.get("stream_ordering"),
            body.get("instance_name"),
        )
        if not isinstance(event_id, str) or not isinstance(ordering, int) or not isinstance(instance, str):
            raise OwnerUnavailable(str(instance), "answered without event_id/stream_ordering/instance_name")
        return cls(event_id, ordering, instance)


def event_to_json(event: NewEvent) -> dict[str, Any]:
    return {
        "event_id": event.event_id, "room_id": event.room_id, "type": event.type,
        "sender": event.sender, "content": event.content, "state_key": event.state_key,
    }  # fmt: skip


def event_from_json(body: Any) -> NewEvent:
    """A forwarded event; ValueError if any field is missing or of the wrong type."""
    if not isinstance(body, dict):
        raise ValueError("an event is an object")
    event_id, room_id, kind, sender = (body.get(k) for k in ("event_id", "room_id", "type", "sender"))
    content, state_key = body.get("content"), body.get("state_key")
    if not all(isinstance(v, str) for v in (event_id, room_id, kind, sender)) or not isinstance(
        content, dict
    ):
        raise ValueError("an event needs event_id, room_id, type, sender (strings) and content (object)")
    if state_key is not None and not isinstance(state_key, str):
        raise ValueError("state_key must be a string or null")
    return NewEvent(str(event_id), str(room_id), str(kind), str(sender), content, state_key)


@dataclass(frozen=True, slots=True)
class RemoteInvite:
    """An invite from another server (federation's `PUT /invite/{roomId}/{eventId}` body, checked)."""

    room_id: str
    room_version: str
    event: NewEvent
    invite_state: list[dict[str, Any]]

    @property
    def invitee(self) -> str:
        return str(self.event.state_key)

    def to_json(self) -> dict[str, Any]:
        return {
            "room_version": self.room_version,
            "event": event_to_json(self.event),
            "invite_room_state": self.invite_state,
        }

    @classmethod
    def from_json(cls, room_id: str, event_id: str, body: dict[str, Any]) -> RemoteInvite:
        """The invite of a request body; ValueError when it is not one."""
        version, raw, state = body.get("room_version"), body.get("event"), body.get("invite_room_state", [])
        if not isinstance(version, str) or not isinstance(raw, dict):
            raise ValueError("an invite has room_version (a string) and event (an object)")
        event = event_from_json({**raw, "event_id": event_id, "room_id": room_id})
        if event.type != MEMBER_EVENT or event.membership != "invite" or event.state_key is None:
            raise ValueError("the event must be an m.room.member invite with a state_key")
        if (
            not isinstance(state, list)
            or len(state) > MAX_INVITE_STATE
            or not all(
                isinstance(e, dict)
                and isinstance(e.get("type"), str)
                and isinstance(e.get("state_key", ""), str)
                for e in state
            )
        ):
            raise ValueError(f"invite_room_state is a list of up to {MAX_INVITE_STATE} stripped state events")
        stripped = [
            {"type": e["type"], "state_key": e.get("state_key", ""), "content": e.get("content", {}),
             "sender": e.get("sender", event.sender)}
            for e in state
        ]  # fmt: skip
        return cls(room_id, version, event, stripped)
