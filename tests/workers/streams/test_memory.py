"""In-memory stream positions and history: monotone tokens, bounded history, reset when too old."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workers.streams.memory import MemoryPositions, StreamHistory, epoch_token


def test_a_restarted_writer_starts_above_its_earlier_run() -> None:
    first = MemoryPositions("w", ["w"], epoch_token(1_000.0))
    for _ in range(5000):
        first.next_token()
    second = MemoryPositions("w", ["w"], epoch_token(1_010.0))  # restarted 10 s later
    assert second.get_current_token_for_writer("w") > first.get_current_token_for_writer("w")


def test_readers_positions_only_move_forward() -> None:
    positions = MemoryPositions("r", ["w"], 0)
    positions.advance("w", 10)
    positions.advance("w", 3)
    assert positions.get_current_token_for_writer("w") == 10
    assert positions.current == 10


@given(
    st.integers(1, 50),
    st.lists(st.integers(1, 3), min_size=1, max_size=200),
    st.integers(0, 400),
    st.integers(1, 20),
)
def test_history_serves_exactly_the_rows_after_from_or_says_reset(
    max_rows: int, per_token: list[int], from_offset: int, limit: int
) -> None:
    start = 100
    history: StreamHistory[int] = StreamHistory(start, max_rows)
    produced: list[tuple[int, int]] = []
    token = start
    for count in per_token:
        token += 1
        for i in range(count):
            history.append(token, i)
            produced.append((token, i))
    from_token = start + from_offset % (token - start + 1)
    rows = history.since(from_token, token, limit)
    kept = produced[-max_rows:]
    if rows is None:
        # Reset only when rows after `from` really were dropped.
        assert any(t > from_token for t, _ in produced[: len(produced) - len(kept)])
    else:
        expected = [r for r in produced if r[0] > from_token]
        assert rows == expected[:limit]
