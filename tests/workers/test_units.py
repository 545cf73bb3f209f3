"""Plain logic of the worker: room rules, batched invalidations, caches, notifier, routing."""

from __future__ import annotations

import asyncio
import json

import pydantic_core
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub.streams import Stream
from tests.pubsub.fakes import MemoryGenerator, MemoryTable
from workers.handlers import rooms
from workers.handlers.caches import LruCache
from workers.handlers.notifier import Notifier
from workers.http import client_api
from workers.model import (
    CURRENT_STATE_CACHE,
    MEMBER_EVENT,
    MEMBERS_PER_INVALIDATION,
    MEMBERSHIPS,
    Event,
    NewEvent,
    StateChanges,
)
from workers.routing import writer_for_room
from workers.streams.events import EventRow, row_json

_EVENTS = Stream("events", EventRow, MemoryTable().update, MemoryGenerator(["p1"]), ["p1"])


def _member(user: str, membership: str, sender: str | None = None) -> NewEvent:
    return NewEvent("$e", "!r", "m.room.member", sender or user, {"membership": membership}, user)


def test_one_invalidation_row_per_room_chunked_by_members() -> None:
    changes = StateChanges()
    members = [f"@u{i}" for i in range(MEMBERS_PER_INVALIDATION + 7)]
    for user in members:
        changes.add(_member(user, "join"))
    changes.add(NewEvent("$t", "!r", "m.room.topic", "@u0", {"topic": "x"}, ""))
    changes.add(NewEvent("$m", "!r", "m.room.message", "@u0", {"body": "not state"}))
    changes.add(NewEvent("$t2", "!other", "m.room.topic", "@u0", {"topic": "x"}, ""))
    rows = changes.invalidations(123)
    assert [r.cache_func for r in rows] == [CURRENT_STATE_CACHE] * 3
    assert rows[0].keys == ("!r", *members[:MEMBERS_PER_INVALIDATION])
    assert rows[1].keys == ("!r", *members[MEMBERS_PER_INVALIDATION:])
    assert rows[2].keys == ("!other",)


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
    ],
)  # fmt: skip
def test_room_rules(event: NewEvent, view: rooms.RoomView, error: type[Exception] | None) -> None:
    if error is None:
        rooms.check(event, view)
    else:
        with pytest.raises(error):
            rooms.check(event, view)


async def test_lru_evicts_and_a_load_overlapping_an_invalidation_is_not_stored() -> None:
    release = asyncio.Event()
    loads: list[str] = []

    async def load(key: str) -> str:
        loads.append(key)
        if key == "slow":
            await release.wait()
        return f"v{len(loads)}"

    cache: LruCache[str, str] = LruCache("t", 2, load)
    assert await cache.get("a") == "v1"
    assert await cache.get("a") == "v1" and cache.hits == 1
    await cache.get("b")
    await cache.get("c")
    assert "a" not in cache and len(cache) == 2 and cache.evictions == 1
    pending = asyncio.create_task(cache.get("slow"))
    await asyncio.sleep(0)
    cache.invalidate("slow")
    release.set()
    await pending
    assert "slow" not in cache  # loaded before the invalidation finished: never cached


async def test_notifier_wakes_only_concerned_waiters() -> None:
    notifier = Notifier()
    with notifier.waiter("@a", frozenset({"!r1"})) as a, notifier.waiter("@b", frozenset({"!r2"})) as b:
        assert notifier.notify({"!r1"}, set()) == 1
        assert a.event.is_set() and not b.event.is_set()
        assert notifier.notify(set(), {"@b"}) == 1
        assert await b.wait(0.01)
    assert notifier.waiting == 0


def test_rooms_spread_over_writers_stably() -> None:
    writers = ["p1", "p2"]
    owners = {writer_for_room(f"!room{i}", writers) for i in range(50)}
    assert owners == {"p1", "p2"}
    assert writer_for_room("!x", writers) == writer_for_room("!x", writers)
    with pytest.raises(ValueError):
        writer_for_room("!x", [])


@settings(max_examples=300, deadline=None)
@given(
    user=st.from_regex(client_api._USER_ID, fullmatch=True),
    room=st.from_regex(client_api._ROOM_ID, fullmatch=True),
    event_type=st.one_of(st.just(MEMBER_EVENT), st.from_regex(client_api._TYPE, fullmatch=True)),
    state_key=st.one_of(st.none(), st.text(max_size=255)),
    membership=st.one_of(st.sampled_from(sorted(MEMBERSHIPS)), st.text(max_size=300), st.integers()),
    ordering=st.integers(min_value=-(2**62), max_value=2**62),
)
def test_staged_event_row_is_what_readers_accept(
    user: str, room: str, event_type: str, state_key: str | None, membership: object, ordering: int
) -> None:
    """The persister stages `row_json(event)` without validating it (see its docstring): for every
    event the API can accept, readers must validate it to the same row as `EventRow.of`."""
    event = Event(
        ordering, "p1", rooms.new_event_id(), room, event_type, user, {"membership": membership},
        state_key, 1,
    )  # fmt: skip
    assert _EVENTS.parse_payload(Stream.encode_payload(row_json(event), 0, 1), True) == (
        EventRow.of(event),
        0,
        1,
    )


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
