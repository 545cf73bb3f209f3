"""One rendered and encoded /sync answer for the readers a wake answers alike.

A wake answers many long-polls at once with one token. Readers of the same rooms with the same
filter then get answers that differ in nothing: the same `next_batch`, the same timelines, empty
per-user sections. `answer_key` says when an answer is such a one, and names it; `SharedAnswers`
keeps the body built for the first reader and, once encoded, its bytes, for the others.

An answer is shared only when it is made of nothing but the window's events placed under
`rooms.join` and the device's key counts:
* no typing, presence or stored-stream news (account data, receipts, to-device, device lists):
  those are per user;
* no `full_state`;
* none of the window's events is the reader's own member event: that alone places a room under
  `leave`, `invite` or `knock`, opens history before the window, or (lazy-loaded members) keeps
  the reader's member event in a room's state.
Everything else a reader's answer depends on acts through which events its window holds (history
visibility, membership, the filter's rooms and senders, paging) or is in the key (`next_batch`, the
filter's value, the key counts): two readers with the same key get the same body. Unread counts
and room summaries are constants here. An answer that is not shareable is built for its reader
alone, as before.

The bodies handed out are shared: callers must not change them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import pydantic_core

from workers.handlers.sync.filter import SyncFilter
from workers.handlers.sync.stored_sections import StoredUpdates
from workers.model import MEMBER_EVENT, Event

#: Answers kept (a wake of R rooms with one filter needs R; the oldest are dropped first).
MAX_SHARED = 512


def answer_key(
    user_id: str,
    next_batch: str,
    sync_filter: SyncFilter,
    events: Sequence[Event],
    news_beyond_events: bool,
    stored: StoredUpdates,
) -> Hashable | None:
    """The key under which readers get the same answer, or None when this one is the reader's
    own (`news_beyond_events`: typing, presence, stored-stream news or `full_state`)."""
    if news_beyond_events or stored:
        return None
    for event in events:
        if event.state_key == user_id and event.type == MEMBER_EVENT:
            return None
    fallback = stored.unused_fallback_key_types
    return (
        next_batch,
        sync_filter,
        tuple(e.event_id for e in events),
        frozenset(stored.one_time_key_counts.items()),
        None if fallback is None else tuple(fallback),
    )


class _Shared:
    __slots__ = ("body", "encoded")

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.encoded: bytes | None = None


class SharedAnswers:
    """Bodies by `answer_key`, and their JSON encoding, built once for every reader they answer.
    `built` counts the answers built and kept, `shared` the readers answered with one of them."""

    def __init__(self, max_entries: int = MAX_SHARED) -> None:
        self._max = max_entries
        self._by_key: dict[Hashable, _Shared] = {}
        self._by_body: dict[int, _Shared] = {}
        self.built = 0
        self.shared = 0

    def get(self, key: Hashable | None) -> dict[str, Any] | None:
        """The body kept under `key` (None: none, or no key)."""
        if key is None:
            return None
        found = self._by_key.get(key)
        if found is None:
            return None
        self.shared += 1
        return found.body

    def keep(self, key: Hashable | None, body: dict[str, Any]) -> None:
        """Keep `body` as the answer under `key` (nothing without a key)."""
        if key is None:
            return
        if len(self._by_key) >= self._max:
            oldest = self._by_key.pop(next(iter(self._by_key)))
            del self._by_body[id(oldest.body)]
        entry = self._by_key[key] = _Shared(body)
        self._by_body[id(body)] = entry
        self.built += 1

    def encode(self, body: dict[str, Any]) -> bytes:
        """`body` as JSON; a kept body is encoded once (pydantic-core's encoder: a third of
        json.dumps's CPU on a /sync body, the same JSON)."""
        entry = self._by_body.get(id(body))
        if entry is None or entry.body is not body:
            return pydantic_core.to_json(body)
        if entry.encoded is None:
            entry.encoded = pydantic_core.to_json(body)
        return entry.encoded
