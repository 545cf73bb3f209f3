"""workers.streams.events: the row a persister stages is the row readers accept."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub.streams import Stream
from tests.pubsub.fakes import MemoryGenerator, MemoryTable
from workers import identifiers
from workers.handlers.rooms import rules as rooms
from workers.model import MEMBER_EVENT, MEMBERSHIPS, REDACTION_EVENT, Event
from workers.streams.events import EventRow, row_json, with_after

_EVENTS = Stream("events", EventRow, MemoryTable().update, MemoryGenerator(["p1"]), ["p1"])


@settings(max_examples=300, deadline=None)
@given(
    user=st.from_regex(identifiers.USER_ID_PATTERN, fullmatch=True),
    room=st.from_regex(identifiers.ROOM_ID_PATTERN, fullmatch=True),
    event_type=st.one_of(
        st.just(MEMBER_EVENT),
        st.text(min_size=1, max_size=255).filter(str.isprintable),
    ),
    state_key=st.one_of(st.none(), st.text(max_size=255)),
    membership=st.one_of(st.sampled_from(sorted(MEMBERSHIPS)), st.text(max_size=300), st.integers()),
    ordering=st.integers(min_value=-(2**62), max_value=2**62),
    version=st.one_of(st.none(), st.sampled_from(["1", "10", "11"])),
)
def test_staged_event_row_is_what_readers_accept(
    user: str,
    room: str,
    event_type: str,
    state_key: str | None,
    membership: object,
    ordering: int,
    version: str | None,
) -> None:
    """The persister stages `row_json(event)` without validating it (see its docstring): for every
    event the API can accept, readers must validate it to the same row as `EventRow.of`."""
    event = Event(
        ordering, "p1", rooms.new_event_id(), room, event_type, user, {"membership": membership},
        state_key, 1,
    )  # fmt: skip
    assert _EVENTS.parse_payload(Stream.encode_payload(row_json(event, version), 0, 1), True) == (
        EventRow.of(event, version),
        0,
        1,
    )


def test_a_redactions_row_names_its_target_and_other_rows_none() -> None:
    """The trailing `redacts` field: a redaction's row carries the id it names (when a row can
    carry it), every other row None; readers get the same row from the staged JSON."""
    room = "!r:hs"
    rows = []
    for content in ({"redacts": "$target"}, {"redacts": "$not an id"}, {"redacts": 5}, {}):
        event = Event(7, "p1", "$red", room, REDACTION_EVENT, "@u:hs", content, None, 1)
        row = _EVENTS.parse_payload(Stream.encode_payload(row_json(event, "11"), 0, 1), True)[0]
        assert row == EventRow.of(event, "11")
        rows.append(row.redacts)
    message = Event(8, "p1", "$m", room, "m.room.message", "@u:hs", {"redacts": "$target"}, None, 1)
    assert _EVENTS.parse_payload(row_json(message, "11"), False)[0].redacts is None
    assert rows == ["$target", None, None, None]


def test_only_a_redactions_row_has_the_trailing_field() -> None:
    """Rows of every other event are as the previous release wrote them (seven fields)."""
    message = Event(8, "p1", "$m", "!r:hs", "m.room.message", "@u:hs", {"body": "hi"}, None, 1)
    redaction = message._replace(type=REDACTION_EVENT, content={"redacts": "$m"})
    assert len(json.loads(row_json(message, "10"))) == 7
    assert json.loads(row_json(redaction, "10"))[7:] == ["$m"]


def test_a_moved_rooms_row_carries_what_it_depends_on() -> None:
    """`with_after`: the staged row with the old writer's last event of the room, after `redacts`
    (null when the row had none); readers get `EventRow.of(..., after)` and the stream names it."""
    events = Stream(
        "events", EventRow, MemoryTable().update, MemoryGenerator(["p1"]), ["p1"], dependency_field="after"
    )
    for event_type, content in (
        ("m.room.message", {"body": "hi"}),
        (REDACTION_EVENT, {"redacts": "$target"}),
    ):
        event = Event(7, "p2", rooms.new_event_id(), "!r:hs", event_type, "@u:hs", content, None, 1)
        staged = with_after(event, row_json(event, "11"), ("p1", 5))
        row, _, _ = events.parse_payload(Stream.encode_payload(staged, 0, 1), True)
        assert row == EventRow.of(event, "11", ("p1", 5))
        assert events.dependencies("p2", [(7, row)]) == {"p1": 5}
    assert json.loads(with_after(event, row_json(event, None), ("p1", 5)))[-2:] == ["$target", [["p1", 5]]]
