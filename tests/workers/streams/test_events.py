"""workers.streams.events: the row a persister stages is the row readers accept."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub.streams import Stream
from tests.pubsub.fakes import MemoryGenerator, MemoryTable
from workers import identifiers
from workers.handlers import rooms
from workers.model import MEMBER_EVENT, MEMBERSHIPS, Event
from workers.streams.events import EventRow, row_json

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
