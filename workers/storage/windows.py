"""`Window`: the rows of a multi-writer stream between two tokens, as a SQL condition.

A token is a vector clock (`idgen.MultiWriterStreamToken`): writer w has everything up to
`token.get_stream_pos_for_instance(w)`. The rows between tokens `low` and `high` are, for each
writer, those with `low(w) < stream_id <= high(w)`; writers named in neither token are at the
tokens' `stream` positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from idgen import MultiWriterStreamToken


@dataclass(frozen=True, slots=True)
class Window:
    """Per writer, the range (low, high] of stream ids; `default` for writers not listed."""

    per_writer: Mapping[str, tuple[int, int]]
    default: tuple[int, int]

    @classmethod
    def between(cls, low: MultiWriterStreamToken | None, high: MultiWriterStreamToken) -> Window:
        """The rows after `low` (None: from the start) up to `high`."""
        if low is None:
            low = MultiWriterStreamToken(0)
        names = set(low.instance_map) | set(high.instance_map)
        return cls(
            {n: (low.get_stream_pos_for_instance(n), high.get_stream_pos_for_instance(n)) for n in names},
            (low.stream, high.stream),
        )

    def condition(self, first: int, instance: str = "instance_name", stream_id: str = "stream_id") -> str:
        """A WHERE condition over columns `instance` and `stream_id` that takes `params()` as
        `$first`..`$first+4`."""
        n = first
        pick = (
            f"(SELECT w.{{}} FROM unnest(${n}::text[], ${n + 1}::bigint[], ${n + 2}::bigint[])"
            f" AS w(name, low, high) WHERE w.name = {instance})"
        )
        return (
            f"{stream_id} > coalesce({pick.format('low')}, ${n + 3})"
            f" AND {stream_id} <= coalesce({pick.format('high')}, ${n + 4})"
        )

    def params(self) -> list[Any]:
        names = list(self.per_writer)
        return [
            names,
            [self.per_writer[n][0] for n in names],
            [self.per_writer[n][1] for n in names],
            self.default[0],
            self.default[1],
        ]
