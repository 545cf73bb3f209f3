"""An ID generator held in memory: per-writer positions only, no database.

What a pure reader's generator does with `advance`, for the pubsub benchmark (which measures
replication, not Postgres) and the handler tests that need no database. It satisfies the
`IdGenerator` protocol `pubsub.streams.Stream` takes.
"""

from __future__ import annotations

from collections.abc import Iterable


class MemoryGenerator:
    """Per-writer positions: each writer starts at `start` and only moves forward."""

    def __init__(self, writers: Iterable[str] = (), start: int = 0) -> None:
        self.positions = dict.fromkeys(writers, start)

    def get_current_token_for_writer(self, instance_name: str) -> int:
        return self.positions.get(instance_name, 0)

    def advance(self, instance_name: str, new_id: int) -> None:
        if new_id > self.positions.get(instance_name, 0):
            self.positions[instance_name] = new_id

    def get_positions(self) -> dict[str, int]:
        return dict(self.positions)
