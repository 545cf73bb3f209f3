"""Test doubles for handler unit tests that need no database: an in-memory table and stream (the
in-memory generator is the harness's, shared with the pubsub benchmark)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pubsub.streams import Stream
from workers.harness.memory import MemoryGenerator

__all__ = ["MemoryGenerator", "MemoryTable", "Row", "memory_stream"]


class Row(NamedTuple):
    payload: str
    n: int = 0


class MemoryTable:
    """Rows per writer, served through an update function that counts its calls."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[int, Row]]] = {}
        self.calls: list[tuple[str, int, int, int]] = []

    def add(self, instance: str, token: int, row: Row) -> None:
        self.rows.setdefault(instance, []).append((token, row))

    async def update(
        self, instance: str, from_token: int, to_token: int, limit: int
    ) -> list[tuple[int, Row]]:
        self.calls.append((instance, from_token, to_token, limit))
        rows = [r for r in self.rows.get(instance, []) if from_token < r[0] <= to_token]
        return sorted(rows, key=lambda r: r[0])[:limit]


def memory_stream(name: str, writers: Sequence[str], table: MemoryTable) -> Stream[Row]:
    return Stream(name, Row, table.update, MemoryGenerator(writers), writers)
