"""When a stream queue's entries were received, for the received -> applied histogram.

An entry (one RDATA line) carries no time of its own: the queue's tuples are built once per line
on the hottest path. Instead the handler marks each socket read that queued something, as the
number of entries ever queued once that read's were, with the read's time; the queue counts the
entries it takes. The entries taken for one apply are then covered by a few marks, and each mark
is observed once, weighted by how many of those entries it covers: a cost per read and per apply,
never per line.
"""

from __future__ import annotations

from collections import deque

from pubsub.histograms import HistogramChild


class Arrivals:
    """Marks `(entries queued so far, monotonic time)` and `taken`, the entries taken so far."""

    __slots__ = ("marks", "taken")

    def __init__(self) -> None:
        #: Oldest first; read inline by the queue, which skips calls when there is nothing to do.
        self.marks: deque[tuple[int, float]] = deque()
        self.taken = 0

    def mark(self, queued: int, at: float) -> None:
        """The entries up to ordinal `queued` (1-based, counting every entry ever queued) that no
        earlier mark covers were received at `at`."""
        marks = self.marks
        if not marks or marks[-1][0] < queued:
            marks.append((queued, at))

    def dropped(self, count: int) -> None:
        """`count` queued entries were thrown away (an overflow): counted as taken, unobserved."""
        self.taken += count
        self.marks.clear()

    def observe(self, first: int, last: int, done: float, child: HistogramChild) -> None:
        """Entries `first`..`last` (ordinals of taken entries) were applied at `done`."""
        marks, start = self.marks, first
        while marks and start <= last:
            queued, at = marks[0]
            if queued < start:
                marks.popleft()
                continue
            upto = queued if queued < last else last
            child.observe(done - at, upto - start + 1)
            start = upto + 1
            if queued <= last:
                marks.popleft()

    def prune(self) -> None:
        """Forget the marks of entries already taken (positions, duplicates, refused lines)."""
        marks, taken = self.marks, self.taken
        while marks and marks[0][0] <= taken:
            marks.popleft()
