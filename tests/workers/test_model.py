"""workers.model: batched invalidation rows and the stored JSON text of an event."""

from __future__ import annotations

import json

import pydantic_core
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.model import CURRENT_STATE_CACHE, KEYS_PER_INVALIDATION, Event, NewEvent, StateChanges


def _member(user: str, membership: str, sender: str | None = None) -> NewEvent:
    return NewEvent("$e", "!r", "m.room.member", sender or user, {"membership": membership}, user)


def test_a_batch_invalidates_in_as_few_rows_as_fit() -> None:
    changes = StateChanges()
    members = [f"@u{i}" for i in range(KEYS_PER_INVALIDATION + 7)]
    for user in members:
        changes.add(_member(user, "join"))
    changes.add(NewEvent("$t", "!r", "m.room.topic", "@u0", {"topic": "x"}, ""))
    changes.add(NewEvent("$m", "!r", "m.room.message", "@u0", {"body": "not state"}))
    changes.add(NewEvent("$t2", "!other", "m.room.topic", "@u0", {"topic": "x"}, ""))
    changes.add(NewEvent("$t3", "!third", "m.room.member", "@v", {"membership": "join"}, "@v"))
    rows = changes.invalidations(123)
    assert [r.cache_func for r in rows] == [CURRENT_STATE_CACHE] * 2
    assert all(len(r.keys or ()) <= KEYS_PER_INVALIDATION for r in rows)
    assert rows[0].keys == ("!r", *members[: KEYS_PER_INVALIDATION - 1])
    # the rest of !r's members (its id first again), then the other rooms while they fit
    assert rows[1].keys == ("!r", *members[KEYS_PER_INVALIDATION - 1 :], "!other", "!third", "@v")


def test_many_small_rooms_share_one_row() -> None:
    changes = StateChanges()
    for i in range(10):
        changes.add(NewEvent(f"$t{i}", f"!room{i}", "m.room.topic", "@a", {"topic": "x"}, ""))
    assert [r.keys for r in changes.invalidations(1)] == [tuple(f"!room{i}" for i in range(10))]


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(),
    state_key=st.one_of(st.none(), st.text()),
    content=st.dictionaries(st.text(), st.one_of(st.none(), st.booleans(), st.integers(), st.text())),
    ordering=st.integers(min_value=-(2**62), max_value=2**62),
)
def test_stored_json_is_the_client_dict(
    text: str, state_key: str | None, content: dict[str, object], ordering: int
) -> None:
    """`Event.to_json` builds its text directly: it must be the compact JSON of `client_dict()`
    whatever the strings hold (quotes, backslashes, control and non-ASCII characters)."""
    event = Event(ordering, "p1", f"${text}", f"!{text}", text, f"@{text}", content, state_key, 1)
    assert event.to_json() == pydantic_core.to_json(event.client_dict()).decode()
    assert json.loads(event.to_json()) == event.client_dict()
