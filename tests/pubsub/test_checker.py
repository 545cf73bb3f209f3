"""The exactly-once/order checker must complain about broken histories."""

from __future__ import annotations

import pytest

from tests.pubsub.conftest import check_history


def test_accepts_a_good_history() -> None:
    check_history([("w1", 1, 1), ("w2", 2, 1), ("w1", 3, 2), ("w1", 3, 3)], {"w1": [1, 2, 3], "w2": [1]})


@pytest.mark.parametrize(
    "history",
    [
        [("w1", 1, 1), ("w1", 2, 2), ("w1", 2, 2)],  # duplicate
        [("w1", 1, 1)],  # missing
        [("w1", 2, 2), ("w1", 1, 1)],  # out of order
        [("w1", 1, 1), ("w1", 2, 2), ("w1", 3, 9)],  # unexpected row
        [("w1", 1, 2), ("w1", 1, 1)],  # rows of one token in the wrong order
    ],
)
def test_rejects_a_broken_history(history: list[tuple[str, int, int]]) -> None:
    with pytest.raises(AssertionError):
        check_history(history, {"w1": [1, 2]} if len(history) < 3 else {"w1": [1, 2, 3]})
