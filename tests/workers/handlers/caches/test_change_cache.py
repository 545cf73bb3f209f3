"""workers.handlers.caches.change_cache: which entities changed after a position, without a query."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idgen import MultiWriterStreamToken
from workers.handlers.caches import change_cache
from workers.handlers.caches.change_cache import StreamChangeCache


def _changes(test: Callable[..., None]) -> Callable[..., None]:
    """Rows in any order (several writers), a `since`, and a cache small enough to drop entries."""
    return settings(max_examples=200, deadline=None)(
        given(
            changes=st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(1, 60)), max_size=40),
            since=st.integers(0, 60),
            size=st.integers(1, 6),
        )(test)
    )


def test_known_changes_and_the_floor() -> None:
    cache = StreamChangeCache("s", floor=10)
    cache.changed("@a", 12)
    cache.changed("@a", 11)  # older: ignored
    cache.changed("@b", 5)  # below the floor: written before this cache began, not recorded
    assert cache.may_have_changed("@a", 11) and not cache.may_have_changed("@a", 12)
    assert not cache.may_have_changed("@b", 10) and not cache.may_have_changed("@c", 10)
    # Below the floor the cache does not know: the caller must look in the database.
    assert cache.may_have_changed("@c", 9)
    assert cache.any_may_have_changed(["@a", "@b", "@c"], 10) == ["@a"]
    assert cache.any_may_have_changed(["@a", "@b"], 3) == ["@a", "@b"]
    assert cache.changed_after(11) == ["@a"] and cache.changed_after(9) is None
    # Answered here: hits; "maybe" because the cache cannot know: misses (each costs a query).
    assert (cache.hits, cache.misses) == (6, 3)


def test_dropping_old_entries_raises_the_floor() -> None:
    cache = StreamChangeCache("s", floor=0, max_entries=2)
    for n, user in enumerate(["@a", "@b", "@c"], start=1):
        cache.changed(user, n)
    assert len(cache) == 2 and cache.floor == 1 and cache.evictions == 1
    assert cache.may_have_changed("@a", 0)  # below the floor now: unknown, so "maybe"


@_changes
def test_never_says_unchanged_for_an_entity_that_changed(
    changes: list[tuple[str, int]], since: int, size: int
) -> None:
    """The one promise: "not changed" is only answered when true (a "maybe" costs a query)."""
    cache = StreamChangeCache("s", floor=0, max_entries=size)
    for entity, stream_id in changes:
        cache.changed(entity, stream_id)
    for entity in "abcdef":
        truly = any(e == entity and s > since for e, s in changes)
        if truly:
            assert cache.may_have_changed(entity, since)


def test_blind_while_a_writer_it_does_not_follow_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """During a change of `stream_writers` a reader refuses the lines of a writer it does not know
    yet: that writer's rows never reach the cache, so it must not answer "unchanged" meanwhile."""
    monkeypatch.setattr(change_cache, "BLIND_S", 0.05)
    cache = StreamChangeCache("s", floor=10)
    assert not cache.may_have_changed("@a", 10)
    cache.blind()
    assert cache.may_have_changed("@a", 10) and cache.any_may_have_changed(["@a", "@b"], 10) == ["@a", "@b"]
    time.sleep(0.06)
    assert cache.blind_over() and cache.may_have_changed("@a", 25)  # blind until reopened
    cache.reopen(25)  # what the foreign writer wrote lies at or below the sequence's value now
    assert cache.may_have_changed("@a", 20)  # below the new floor: ask the database
    assert not cache.may_have_changed("@a", 25) and cache.floor == 25


@_changes
def test_changed_after_lists_exactly_the_entities_that_changed(
    changes: list[tuple[str, int]], since: int, size: int
) -> None:
    """Either "cannot know" (None) or every entity with a change above `since`, each once, and
    none whose changes are all at or below it: whatever order the rows arrived in."""
    cache = StreamChangeCache("s", floor=0, max_entries=size)
    for entity, stream_id in changes:
        cache.changed(entity, stream_id)
    listed = cache.changed_after(since)
    if since < cache.floor:
        assert listed is None
        return
    assert listed is not None and len(listed) == len(set(listed))
    assert set(listed) == {e for e, s in changes if s > since}


def test_changed_after_is_none_while_blind(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = StreamChangeCache("s", floor=10)
    cache.changed("@a", 11)
    assert cache.changed_after(10) == ["@a"] and cache.changed_after(9) is None
    cache.blind()
    assert cache.changed_after(10) is None


@settings(max_examples=400, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from("abcd"), st.sampled_from(["w1", "w2"]), st.booleans()), max_size=30
    ),
    interleaving=st.lists(st.booleans(), max_size=60),
    low=st.tuples(st.integers(0, 30), st.integers(0, 30)),
    high=st.tuples(st.integers(0, 30), st.integers(0, 30)),
    size=st.integers(1, 6),
)  # fmt: skip
def test_changed_within_a_window_is_certain_or_left_to_the_database(
    rows: list[tuple[str, str, bool]],
    interleaving: list[bool],
    low: tuple[int, int],
    high: tuple[int, int],
    size: int,
) -> None:
    """Whatever the interleaving of the writers' rows (each writer's in its order), the sizes and
    the windows: an entity said to have changed in (low, high] did, and one neither said to nor
    left to the database did not. Rows of a write whose commit is unknown carry no writer."""
    cache = StreamChangeCache("s", floor=0, max_entries=size, by_writer=True)
    placed = [(position, *row) for position, row in enumerate(rows, start=1)]
    queues = {w: [r for r in placed if r[2] == w] for w in ("w1", "w2")}
    turns = iter(interleaving)
    while queues["w1"] or queues["w2"]:
        writer = "w1" if not queues["w2"] or (queues["w1"] and next(turns, True)) else "w2"
        position, entity, _, known = queues[writer].pop(0)
        cache.changed(entity, position, writer if known else None)
    lows = {"w1": low[0], "w2": low[1]}
    highs = {"w1": max(low[0], high[0]), "w2": max(low[1], high[1])}
    low_token = MultiWriterStreamToken.from_positions(min(lows.values()), lows)
    high_token = MultiWriterStreamToken.from_positions(min(highs.values()), highs)
    changed, unsure = cache.changed_within("abcd", low_token, high_token)
    truth = {e for at, e, w, _ in placed if lows[w] < at <= highs[w]}
    assert changed <= truth
    assert truth <= changed | set(unsure)


def test_changed_within_answers_the_usual_windows_without_the_database() -> None:
    cache = StreamChangeCache("s", floor=0, by_writer=True)
    for position in (5, 10, 15, 20, 25):  # more than it keeps: the change at 5 is dropped
        cache.changed("@a", position, "w1")
    cache.changed("@b", 12, "w2")
    cache.changed("@c", 30, "w1")  # after the window's end
    cache.changed("@d", 13, None)  # a write whose commit is unknown

    def token(w1: int, w2: int) -> MultiWriterStreamToken:
        return MultiWriterStreamToken.from_positions(min(w1, w2), {"w1": w1, "w2": w2})

    changed, unsure = cache.changed_within(["@a", "@b", "@c", "@d", "@e"], token(11, 11), token(16, 16))
    assert changed == {"@a", "@b"} and unsure == ["@d"]
    # Only "@a"'s dropped change could lie in this window: the database must say.
    changed, unsure = cache.changed_within(["@a", "@c"], token(4, 4), token(6, 6))
    assert changed == set() and unsure == ["@a"]
