"""Synapse's own authorization rules as a judge of stored rooms: this file runs inside Synapse's
virtualenv (`python synapse_auth_judge.py < rooms.json`), never in fanout's, and imports nothing of
fanout (`workers.harness.synapse_auth` starts it and reads its answer).

Input on stdin: a JSON list of rooms, each `{"room_id": ..., "events": [...]}` with the room's live
events in stream order (`stream_ordering`, `event_id`, `type`, `sender`, `state_key`, `content`,
`origin_server_ts`). Output on stdout: `{"events": n, "rooms": n, "refused": [...]}`, each refusal
naming the stored event and Synapse's reason.

Each event is rebuilt as a PDU of the room's version whose `prev_events` is the room's previous
accepted event and whose `auth_events` are the current state's entries that
`synapse.event_auth.auth_types_for_event` selects; then `validate_event_for_room_version` (sizes;
the signatures are stand-ins, since one server signs nothing here),
`check_state_independent_auth_rules` and `check_state_dependent_auth_rules` judge it, as Synapse
judges an event it receives. A refused event changes no state, so one bad event is reported once;
content Synapse's code cannot even read (it raises KeyError or TypeError on it) is a refusal too:
Synapse would never have created such an event.
An accepted redaction of a state event in the current state replaces that entry by its pruned
form, as Synapse's state reads return redacted events.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from synapse.api.errors import SynapseError
from synapse.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse.event_auth import (
    auth_types_for_event,
    check_state_dependent_auth_rules,
    check_state_independent_auth_rules,
    validate_event_for_room_version,
)
from synapse.events import make_event_from_dict
from synapse.events.utils import prune_event

#: Stand-ins of the lengths real ones have (the size limit counts them; nothing verifies them).
_HASHES = {"sha256": "A" * 43}
_SIGNATURE = "A" * 86


class _Events:
    """The store `check_state_independent_auth_rules` reads auth events from."""

    def __init__(self) -> None:
        self.by_id: dict[str, Any] = {}

    async def get_events(self, event_ids: Any, **_: Any) -> dict[str, Any]:
        return {i: self.by_id[i] for i in event_ids if i in self.by_id}


async def _judge_room(room: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = room["events"]
    create = next((e for e in events if e["type"] == "m.room.create" and e["state_key"] == ""), None)
    version_name = (create or {}).get("content", {}).get("room_version", "1")
    version = KNOWN_ROOM_VERSIONS.get(version_name)
    if version is None:
        return 0, [_refusal(room, events[0], f"room version {version_name!r} unknown to Synapse")]
    store = _Events()
    state: dict[tuple[str, str], Any] = {}
    ours: dict[str, Any] = {}  # our event id -> the accepted PDU
    prev: list[str] = []
    refused: list[dict[str, Any]] = []
    for depth, stored in enumerate(events, start=1):
        sender = stored["sender"]
        pdu: dict[str, Any] = {
            "type": stored["type"], "room_id": room["room_id"], "sender": sender,
            "content": stored["content"], "origin_server_ts": stored["origin_server_ts"],
            "depth": depth, "prev_events": prev, "auth_events": [], "hashes": _HASHES,
            "signatures": {sender.partition(":")[2]: {"ed25519:a_judge": _SIGNATURE}},
        }  # fmt: skip
        if stored["state_key"] is not None:
            pdu["state_key"] = stored["state_key"]
        redacts = stored["content"].get("redacts") if stored["type"] == "m.room.redaction" else None
        if isinstance(redacts, str) and redacts in ours:
            pdu["redacts"] = ours[redacts].event_id  # v10 and before: a top-level key
        try:
            draft = make_event_from_dict(pdu, version)
            keys = [k for k in auth_types_for_event(version, draft) if k in state]
            pdu["auth_events"] = [state[k].event_id for k in keys]
            event = make_event_from_dict(pdu, version)
            validate_event_for_room_version(event)
            await check_state_independent_auth_rules(store, event)
            check_state_dependent_auth_rules(event, [state[k] for k in keys])
        except SynapseError as error:
            refused.append(_refusal(room, stored, f"{type(error).__name__}: {error.msg}"))
            continue
        except (KeyError, TypeError, ValueError, AttributeError) as error:  # content Synapse never stores
            refused.append(
                _refusal(room, stored, f"Synapse's rules failed on it: {type(error).__name__} {error}")
            )
            continue
        store.by_id[event.event_id] = event
        ours[stored["event_id"]] = event
        prev = [event.event_id]
        if event.is_state():
            state[(event.type, event.state_key)] = event
        target = ours.get(redacts) if isinstance(redacts, str) else None
        if target is not None and target.is_state():
            key = (target.type, target.state_key)
            if key in state and state[key].event_id == target.event_id:
                state[key] = prune_event(target)
    return len(events), refused


def _refusal(room: dict[str, Any], stored: dict[str, Any], reason: str) -> dict[str, Any]:
    return {
        "room_id": room["room_id"], "event_id": stored["event_id"], "type": stored["type"],
        "stream_ordering": stored["stream_ordering"], "reason": reason,
    }  # fmt: skip


async def _judge(rooms: list[dict[str, Any]]) -> dict[str, Any]:
    judged, refused = 0, []
    for room in rooms:
        count, room_refused = await _judge_room(room)
        judged += count
        refused += room_refused
    return {"events": judged, "rooms": len(rooms), "refused": refused}


def main() -> None:
    json.dump(asyncio.run(_judge(json.load(sys.stdin))), sys.stdout)


if __name__ == "__main__":
    main()
