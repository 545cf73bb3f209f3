"""An event's relation to another (`m.relates_to` with a `rel_type`): what a client may relate.

The auth rules accept any content; the client API refuses (400, as Synapse answers) a relation to
an event of another room, or to one the server has never seen related to; an annotation (a
reaction) without a key, with a key over 500 characters, or repeating one its sender already made
(`M_DUPLICATE_ANNOTATION`: clients count each reaction once per sender); and a thread started from
an event that itself relates to another.

The repeat is where writes race: two identical reactions sent at once through two workers must not
both be stored. An annotation claims its (sender, parent, type, key) in the room's admission
(`annotation_part`), so the second is checked once the first's batch has committed, and finds it.
`check` runs on the room's writer, after the room's rules, inside the event's admission.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers.handlers.rooms.rules import BadEvent
from workers.model import NewEvent
from workers.storage import Conn
from workers.storage import events as store
from workers.storage import relations as relation_store

RELATES_TO = "m.relates_to"
ANNOTATION = "m.annotation"
THREAD = "m.thread"
#: The longest annotation key Synapse takes (characters).
MAX_KEY_LENGTH = 500


class DuplicateAnnotation(BadEvent):
    """The sender already annotated the event with this key (400 M_DUPLICATE_ANNOTATION)."""

    errcode = "M_DUPLICATE_ANNOTATION"


@dataclass(frozen=True, slots=True)
class Relation:
    rel_type: str
    parent_id: str
    #: An annotation's key (None when absent or not a string).
    key: str | None


def relation_of(content: Mapping[str, Any]) -> Relation | None:
    """The relation `content` makes, or None: an `m.relates_to` object naming a `rel_type` and an
    `event_id`, both non-empty strings (a reply's `m.in_reply_to` alone is not one)."""
    relates = content.get(RELATES_TO)
    if not isinstance(relates, dict):
        return None
    rel_type, parent_id, key = relates.get("rel_type"), relates.get("event_id"), relates.get("key")
    if not isinstance(rel_type, str) or not rel_type or not isinstance(parent_id, str) or not parent_id:
        return None
    return Relation(rel_type, parent_id, key if isinstance(key, str) else None)


async def check(conn: Conn, event: NewEvent) -> None:
    """Raise BadEvent (DuplicateAnnotation) unless `event`'s relation, if it makes one, is one a
    client may make now: a parent stored in this room (or one another stored event relates to), an
    annotation's key of its form and not made before by the sender, a thread not started from an
    event that relates to another."""
    relation = relation_of(event.content)
    if relation is None:
        return
    check_form(relation)
    parent = (await store.events_by_ids(conn, [relation.parent_id])).get(relation.parent_id)
    if parent is None and not await relation_store.is_relation_target(conn, relation.parent_id):
        raise BadEvent(f"{relation.parent_id} is not an event this server has: nothing to relate to")
    if parent is not None and parent.room_id != event.room_id:
        raise BadEvent(f"{relation.parent_id} is an event of another room: a relation stays in its room")
    if relation.rel_type == ANNOTATION and relation.key is not None:
        if await relation_store.has_annotated(
            conn, event.room_id, relation.parent_id, event.sender, event.type, relation.key
        ):
            raise DuplicateAnnotation(f"{event.sender} already annotated {relation.parent_id} with this key")
    elif relation.rel_type == THREAD and parent is not None and relation_of(parent.content) is not None:
        raise BadEvent(f"{relation.parent_id} relates to another event: a thread cannot start from it")


def check_form(relation: Relation) -> None:
    """Raise BadEvent for an annotation without a key or with a key over the limit."""
    if relation.rel_type != ANNOTATION:
        return
    if relation.key is None:
        raise BadEvent("an annotation needs a key (m.relates_to.key)")
    if len(relation.key) > MAX_KEY_LENGTH:
        raise BadEvent(f"an annotation's key is at most {MAX_KEY_LENGTH} characters")


def annotation_part(event: NewEvent) -> str | None:
    """The part of the room's admission an annotation changes (None for any other event): two equal
    annotations by one sender are checked one after the other."""
    relation = relation_of(event.content)
    if relation is None or relation.rel_type != ANNOTATION or relation.key is None:
        return None
    return "\0".join(("annotation", event.sender, relation.parent_id, event.type, relation.key))
