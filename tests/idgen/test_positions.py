"""The pure bookkeeping, without a database: unit tests and a hypothesis model of several writers."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idgen.errors import InconsistentSequenceError
from idgen.positions import MAX_KNOWN_FINISHED, StreamPositions
from idgen.tokens import MultiWriterStreamToken


def allocate(book: StreamPositions, *ids: int) -> None:
    book.end_allocation(book.begin_allocation(), list(ids))


def test_out_of_order_finish_holds_until_the_gap_closes() -> None:
    book = StreamPositions("a", ["a"], persisted_upto=6, own_position=6)
    for i in (7, 8, 9):
        allocate(book, i)
    book.finish([9])
    book.finish([8])
    assert book.minimal_local_position() == 6
    assert book.own_position() == 6
    assert book.persisted_upto == 6
    book.finish([7])
    assert book.minimal_local_position() == 9
    assert book.own_position() == 9
    assert book.persisted_upto == 9


def test_allocation_in_progress_holds_back_the_own_position() -> None:
    book = StreamPositions("a", ["a", "b"], persisted_upto=6, positions={"b": 6}, own_position=6)
    slow = book.begin_allocation()  # the database gave it 7, the answer has not arrived yet
    allocate(book, 8)
    book.finish([8])
    assert book.own_position() == 6
    assert book.persisted_upto == 6
    book.end_allocation(slow, [7])
    assert book.own_position() == 6
    book.finish([7])
    assert book.own_position() == 8
    assert book.persisted_upto == 8


def test_failed_allocation_leaves_a_harmless_gap() -> None:
    book = StreamPositions("a", ["a"], persisted_upto=0)
    marker = book.begin_allocation()
    book.end_allocation(marker, [])  # e.g. cancelled while waiting for nextval
    allocate(book, 2)
    book.finish([2])
    assert book.own_position() == 2
    assert book.persisted_upto == 2
    assert not book.busy


def test_sequence_moved_backwards_is_refused() -> None:
    book = StreamPositions("a", ["a"], persisted_upto=10, own_position=10)
    with pytest.raises(InconsistentSequenceError, match="setval"):
        allocate(book, 10)
    assert not book.busy


def test_idle_writer_follows_other_writers() -> None:
    book = StreamPositions("a", ["a", "b"], persisted_upto=3, positions={"b": 3}, own_position=3)
    book.advance("b", 10)
    assert book.own_position() == 10
    assert book.position_of("a") == 10
    assert book.persisted_upto == 10
    assert book.minimal_local_position() == 3  # not raised by others


def test_busy_writer_advances_while_the_other_is_silent() -> None:
    book = StreamPositions("a", ["a", "b"], persisted_upto=0, positions={"b": 0})
    for i in range(1, 6):
        allocate(book, i)
        book.finish([i])
    assert book.persisted_upto == 5


def test_own_in_flight_ids_hold_back_the_linear_position() -> None:
    book = StreamPositions("a", ["a", "b"], persisted_upto=2, positions={"b": 2}, own_position=2)
    allocate(book, 3)
    book.advance("b", 10)
    assert book.persisted_upto == 2
    assert book.own_position() == 2
    book.finish([3])
    assert book.persisted_upto == 10


def test_unheard_writer_holds_back_linear_but_not_positions_or_tokens() -> None:
    book = StreamPositions("a", ["a", "b", "c"], persisted_upto=0)
    assert book.unheard_writers() == {"b", "c"}
    allocate(book, 1, 2)
    book.advance("b", 5)  # b wrote 3..5 (or some of them); a wrote 1, 2
    book.finish([1, 2])
    assert book.persisted_upto == 2  # c may still be writing 3 or 4
    assert book.positions() == {"a": 2, "b": 5}
    assert book.position_of("c") == 2
    token = MultiWriterStreamToken.from_positions(book.persisted_upto, book.positions())
    assert token.get_stream_pos_for_instance("b") == 5
    book.advance("c", 5)
    assert book.persisted_upto == 5
    assert book.unheard_writers() == frozenset()


def test_reader_only_advances() -> None:
    book = StreamPositions("reader", ["a", "b"], persisted_upto=4, positions={"a": 4, "b": 4})
    assert not book.is_writer
    book.advance("a", 9)
    assert book.persisted_upto == 4
    book.advance("b", 7)
    assert book.persisted_upto == 7
    book.advance("b", 6)  # stale: ignored
    assert book.positions() == {"a": 9, "b": 7}
    book.advance("reader", 100)  # an echo of ourselves carries nothing
    assert book.persisted_upto == 7


def test_rows_of_instances_not_configured_are_ignored() -> None:
    book = StreamPositions("reader", ["a"], persisted_upto=4, positions={"a": 8, "gone": 1})
    assert book.positions() == {"a": 8}
    book.advance("stranger", 2)
    assert book.persisted_upto == 8


def test_open_stream_counts_everyone_heard_from() -> None:
    book = StreamPositions("a", [], persisted_upto=5, own_position=5)
    assert book.is_writer
    book.advance("x", 9)
    assert book.persisted_upto == 9
    allocate(book, 10)
    book.advance("y", 12)
    assert book.persisted_upto == 9  # our 10 is in flight
    book.finish([10])
    assert book.persisted_upto == 10  # x may be writing 11
    book.advance("x", 12)
    assert book.persisted_upto == 12


def test_known_finished_set_is_bounded() -> None:
    book = StreamPositions("a", ["a", "b"], persisted_upto=0, positions={"b": 0})
    ids = list(range(2, MAX_KNOWN_FINISHED + 4, 1))
    allocate(book, *ids)
    book.finish(ids)  # 1 is missing: all of these wait for it (one run)
    assert book.persisted_upto == 0
    book.advance("b", MAX_KNOWN_FINISHED + 3)
    assert book.persisted_upto == MAX_KNOWN_FINISHED + 3


def test_known_finished_runs_are_bounded_and_dropping_them_is_safe() -> None:
    book = StreamPositions("a", ["a", "b"], persisted_upto=0, positions={"b": 0})
    top = 2 * MAX_KNOWN_FINISHED + 6
    allocate(book, *range(2, top + 1))
    evens = list(range(2, top + 1, 2))
    book.finish(evens)  # more disjoint runs than are kept, all waiting for 1: they are dropped
    assert book.persisted_upto == 0
    book.finish(list(range(3, top + 1, 2)))
    assert book.persisted_upto == 0
    assert book.own_position() == top
    book.advance("b", top)
    assert book.persisted_upto == top


def test_finished_batches_close_a_gap_in_any_order() -> None:
    book = StreamPositions("a", ["a", "b"], persisted_upto=0, positions={"b": 0})
    batches = [list(range(1 + 100 * k, 101 + 100 * k)) for k in range(4)]
    for batch in batches:
        allocate(book, *batch)
    book.finish(batches[2] + [399])  # finishing twice is a no-op
    book.finish(batches[1][::-1])
    book.finish(batches[3])
    assert book.persisted_upto == 0
    book.finish(batches[0])
    assert book.persisted_upto == 400


# -- model: several writers sharing one sequence, announcing positions to each other and to a reader --


@dataclass
class Model:
    writers: list[str]
    books: dict[str, StreamPositions]
    next_id: int = 1
    pending: dict[str, list[tuple[int, list[int]]]] = field(default_factory=dict)  # marker, ids from the db
    unfinished: dict[str, set[int]] = field(default_factory=dict)  # known to the db, not finished

    def all_unfinished(self) -> set[int]:
        out = {i for s in self.unfinished.values() for i in s}
        for lst in self.pending.values():
            for _, ids in lst:
                out.update(ids)
        return out


ops = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "slow", "end", "finish", "gossip"]), st.integers(0, 2), st.integers(0, 3)
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.booleans(), st.integers(2, 3))
def test_model_persisted_upto_never_passes_an_unfinished_id(
    steps: list[tuple[str, int, int]], all_heard: bool, n_writers: int
) -> None:
    writers = ["w0", "w1", "w2"][:n_writers]
    heard = dict.fromkeys(writers, 0) if all_heard else {}
    books = {
        w: StreamPositions(w, writers, persisted_upto=0, positions=heard, own_position=0) for w in writers
    }
    books["reader"] = StreamPositions("reader", writers, persisted_upto=0, positions=heard)
    m = Model(writers, books, pending={w: [] for w in writers}, unfinished={w: set() for w in writers})
    last = {name: (b.persisted_upto, b.position_of(name)) for name, b in books.items()}
    # A reader's token memo (the sync handler's) holds while `version` does: the view never changes under it.
    views = {name: (b.version, b.persisted_upto, b.positions()) for name, b in books.items()}

    def check() -> None:
        open_ids = m.all_unfinished()
        for name, book in books.items():
            if book.version == views[name][0]:
                assert (book.persisted_upto, book.positions()) == views[name][1:], name
            views[name] = (book.version, book.persisted_upto, book.positions())
            if open_ids:
                assert book.persisted_upto < min(open_ids), name
            persisted, own = book.persisted_upto, book.position_of(name)
            assert persisted >= last[name][0] and own >= last[name][1], name
            last[name] = (persisted, own)
        for w in writers:
            mine = m.unfinished[w] | {i for _, ids in m.pending[w] for i in ids}
            if mine:
                assert books[w].own_position() < min(mine), w

    for op, wi, k in steps:
        w = writers[wi % n_writers]
        book = books[w]
        if op == "alloc":
            ids = list(range(m.next_id, m.next_id + k + 1))
            m.next_id += k + 1
            book.end_allocation(book.begin_allocation(), ids)
            m.unfinished[w].update(ids)
        elif op == "slow":  # the database answered, the answer has not arrived yet
            marker = book.begin_allocation()
            ids = list(range(m.next_id, m.next_id + k + 1))
            m.next_id += k + 1
            m.pending[w].append((marker, ids))
        elif op == "end" and m.pending[w]:
            marker, ids = m.pending[w].pop(k % len(m.pending[w]))
            book.end_allocation(marker, ids)
            m.unfinished[w].update(ids)
        elif op == "finish" and m.unfinished[w]:
            mine = sorted(m.unfinished[w])
            ids = mine[: k + 1] if k % 2 else mine[-(k + 1) :]  # oldest first, or newest first
            m.unfinished[w].difference_update(ids)
            book.finish(ids)
        elif op == "gossip":  # every writer announces its position to everyone, k + 1 rounds
            for _ in range(k + 1):
                for src in writers:
                    pos = books[src].own_position()
                    for other in books.values():
                        other.advance(src, pos)
        check()

    # Liveness: once everything finished and everyone announced twice, every view is at the top.
    for w in writers:
        for marker, ids in m.pending[w]:
            books[w].end_allocation(marker, ids)
            books[w].finish(ids)
        books[w].finish(sorted(m.unfinished[w]))
        m.pending[w].clear()
        m.unfinished[w].clear()
    for _ in range(2):
        for w in writers:
            for other in books.values():
                other.advance(w, books[w].own_position())
    for name, book in books.items():
        assert book.persisted_upto == m.next_id - 1, name


def test_a_writer_added_while_running_holds_persisted_upto_until_heard() -> None:
    book = StreamPositions("reader", ["a", "b"], persisted_upto=10, positions={"a": 10, "b": 10})
    book.set_writers(["a", "b", "c"])
    book.advance("a", 20)
    book.advance("b", 20)
    assert book.persisted_upto == 10, "c was not heard: it counts where the stream was when added"
    book.advance("c", 15)
    assert book.persisted_upto == 15
    book.advance("c", 25)
    assert book.persisted_upto == 20


def test_a_removed_writer_stops_holding_the_minimum() -> None:
    book = StreamPositions(
        "reader", ["a", "b", "c"], persisted_upto=10, positions={"a": 10, "b": 10, "c": 10}
    )
    book.advance("a", 30)
    book.advance("b", 30)
    assert book.persisted_upto == 10, "c (stopped) holds the minimum while it is a writer"
    book.set_writers(["a", "b"])
    assert book.persisted_upto == 30
    assert book.position_of("c") == 30


def test_an_own_writer_role_survives_its_removal_from_the_list() -> None:
    book = StreamPositions("a", ["a", "b"], persisted_upto=5, positions={"b": 5}, own_position=5)
    book.set_writers(["b"])
    assert book.is_writer
    allocate(book, 6)
    book.finish([6])
    assert book.own_position() == 6
