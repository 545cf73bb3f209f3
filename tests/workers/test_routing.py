"""workers.routing: rooms spread over writers, stably."""

from __future__ import annotations

import pytest

from workers.routing import writer_for_room


def test_rooms_spread_over_writers_stably() -> None:
    writers = ["p1", "p2"]
    owners = {writer_for_room(f"!room{i}", writers) for i in range(50)}
    assert owners == {"p1", "p2"}
    assert writer_for_room("!x", writers) == writer_for_room("!x", writers)
    with pytest.raises(ValueError):
        writer_for_room("!x", [])
