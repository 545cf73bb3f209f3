"""What a client may relate: the relation's form and the annotation's admission part (the stored
checks run in tests/workers/http/test_relations.py)."""

from __future__ import annotations

from typing import Any

import pytest

from workers.handlers.rooms.relations import Relation, annotation_part, check_form, relation_of
from workers.handlers.rooms.rules import BadEvent
from workers.model import NewEvent


@pytest.mark.parametrize(
    ("content", "relation"),
    [
        ({"body": "x"}, None),
        ({"m.relates_to": {"m.in_reply_to": {"event_id": "$a"}}}, None),  # a reply is not a relation
        ({"m.relates_to": {"rel_type": "m.annotation", "event_id": "$a", "key": "+1"}},
         Relation("m.annotation", "$a", "+1")),
        ({"m.relates_to": {"rel_type": "m.annotation", "event_id": "$a", "key": 1}},
         Relation("m.annotation", "$a", None)),
        ({"m.relates_to": {"rel_type": "m.thread", "event_id": "$a"}}, Relation("m.thread", "$a", None)),
        ({"m.relates_to": {"rel_type": "", "event_id": "$a"}}, None),
        ({"m.relates_to": {"rel_type": "m.thread", "event_id": 7}}, None),
        ({"m.relates_to": ["m.thread", "$a"]}, None),
    ],
)  # fmt: skip
def test_a_relation_names_a_type_and_an_event(content: dict[str, Any], relation: Relation | None) -> None:
    assert relation_of(content) == relation


def test_an_annotation_has_a_key_of_at_most_500_characters() -> None:
    check_form(Relation("m.annotation", "$a", "x" * 500))
    check_form(Relation("m.thread", "$a", None))
    for key in (None, "x" * 501):
        with pytest.raises(BadEvent):
            check_form(Relation("m.annotation", "$a", key))


def test_equal_annotations_by_one_sender_claim_the_same_part() -> None:
    def reaction(sender: str, key: str, event_type: str = "m.reaction") -> NewEvent:
        relates = {"rel_type": "m.annotation", "event_id": "$a", "key": key}
        return NewEvent("$x", "!r:hs", event_type, sender, {"m.relates_to": relates})

    assert annotation_part(reaction("@a:hs", "+1")) == annotation_part(reaction("@a:hs", "+1"))
    each = (reaction("@a:hs", "+1"), reaction("@b:hs", "+1"), reaction("@a:hs", "-1"))
    parts = {annotation_part(e) for e in (*each, reaction("@a:hs", "+1", "m.other"))}
    assert len(parts) == 4 and None not in parts
    assert annotation_part(NewEvent("$y", "!r:hs", "m.room.message", "@a:hs", {"body": "x"})) is None
