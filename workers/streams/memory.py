"""Streams kept in memory by their one writer (typing, presence): positions and a bounded history.

There is no table behind these streams. The writer numbers its changes itself and keeps the last
rows in a `StreamHistory`; readers that missed rows fetch them from the writer over a worker
request (see `workers.assembly.ephemeral`), and a reader whose position is older than the history takes a
full snapshot instead ("reset").

Tokens never go down across writer restarts: a writer starts at `epoch_token()`, derived from the
wall clock (milliseconds x 1000), so a restarted writer's first POSITION is above anything its
previous run announced (unless that run made more than 1000 changes per millisecond of its life,
or the clock stepped back by more than the downtime). A reader therefore sees an ordinary gap
(`prev` above what it holds), fetches once, is told "reset", and resyncs from the snapshot: one
fetch per reader per writer start, never a fetch from 0 to 16M as in Synapse#8524. The pubsub
reader treats a token that goes *down* as "nothing to fetch" and then drops rows at or below
what it held, which is why the tokens must not go down.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

R = TypeVar("R")
TOKENS_PER_MS = 1000


def epoch_token(now_s: float | None = None) -> int:
    """The first token of a writer starting now: above every token of its earlier runs."""
    return int((time.time() if now_s is None else now_s) * 1000) * TOKENS_PER_MS


class MemoryPositions:
    """The `pubsub.types.IdGenerator` of an in-memory stream.

    The writer (`instance_name` in `writers`) starts at `start` and takes tokens with
    `next_token()`; every other writer's position is what replication told us (0 until then).
    `advance` is monotone, as pubsub expects.
    """

    __slots__ = ("_positions", "instance_name")

    def __init__(self, instance_name: str, writers: Iterable[str], start: int) -> None:
        self.instance_name = instance_name
        self._positions = {name: 0 for name in writers}
        if instance_name in self._positions:
            self._positions[instance_name] = start

    def get_current_token_for_writer(self, instance_name: str) -> int:
        return self._positions.get(instance_name, 0)

    def advance(self, instance_name: str, new_id: int) -> None:
        if new_id > self._positions.get(instance_name, 0):
            self._positions[instance_name] = new_id

    def get_positions(self) -> dict[str, int]:
        return dict(self._positions)

    def next_token(self) -> int:
        """The writer's next token (call only on the writer; stage its rows before the next call)."""
        token = self._positions[self.instance_name] + 1
        self._positions[self.instance_name] = token
        return token

    @property
    def current(self) -> int:
        """The highest token over all writers (the stream's sync-token component)."""
        return max(self._positions.values(), default=0)


class StreamHistory(Generic[R]):
    """The last `max_rows` (token, row) pairs a writer produced, to serve readers' catch-ups.

    `since(from, to, limit)` returns the rows with `from < token <= to` (at most `limit`), or
    None when rows after `from` may have been dropped already (`from` is below `floor`): the
    reader must then take a snapshot.
    """

    __slots__ = ("_rows", "floor", "max_rows")

    def __init__(self, start: int, max_rows: int = 10_000) -> None:
        self.floor = start
        self.max_rows = max_rows
        self._rows: deque[tuple[int, R]] = deque()

    def append(self, token: int, row: R) -> None:
        self._rows.append((token, row))
        while len(self._rows) > self.max_rows:
            dropped, _ = self._rows.popleft()
            # A reader at `dropped` or above misses nothing; one below it might (even when other
            # rows of `dropped` remain).
            self.floor = max(self.floor, dropped)

    def since(self, from_token: int, to_token: int, limit: int) -> list[tuple[int, R]] | None:
        if from_token < self.floor:
            return None
        out: list[tuple[int, R]] = []
        for token, row in self._rows:
            if token <= from_token:
                continue
            if token > to_token:
                break
            if len(out) >= limit:
                break  # may split a token: pubsub's catch-up keeps only whole tokens of a full page
            out.append((token, row))
        return out

    def __len__(self) -> int:
        return len(self._rows)
