"""Pure bookkeeping of one stream as seen by one process: in-flight IDs, per-writer positions, persisted-upto.

No I/O, no asyncio: `MultiWriterIdGenerator` drives it and every rule is unit-tested without a database.
All values are positive here (negative streams are negated at the edge, in `multi_writer.py`).

Definitions (they are the contract):

* A writer's *position* P means: every ID that writer has allocated, or will ever allocate, at or below P
  has finished (committed or rolled back). Positions only grow.
* *persisted-upto* (the linear position) is the largest X such that every ID <= X, from any writer, has
  finished. It is the minimum of every configured writer's position, raised by runs of consecutive IDs this
  process itself finished. A configured writer never heard from counts at the persisted-upto the stream
  had when this process started (the "new writer" rule: never 0, never ahead).
* This instance, when it has nothing in flight, is at the highest ID it knows of (`max_seen`): any ID it
  allocates later comes from the sequence, so it is larger. That is what an idle writer announces, and
  what keeps a stream advancing while only one writer is busy.
* An allocation in progress (a `nextval` round trip whose IDs are not known yet) holds this instance's
  position at or below the `max_seen` at the moment it started: its IDs will be larger than that.

Difference from Synapse: positions learned through `advance()` are NOT treated as finished IDs for the
consecutive-run shortcut. A writer may announce a position (e.g. the raw sequence value it starts from)
that another writer is still writing, so only IDs this process finished itself are used there.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence

from idgen.errors import InconsistentSequenceError

# Runs of own finished IDs kept above persisted-upto waiting for a gap to close. Dropping them is always
# safe (they only speed things up), so they are bounded rather than allowed to grow behind a dead writer.
MAX_KNOWN_FINISHED = 100_000
#: `StreamPositions.version` values: never reused, so a reloaded book never repeats an old one.
_VERSIONS = itertools.count()


class StreamPositions:
    """The positions of one stream in one process. Not thread-safe; all calls come from one event loop.

    `writers` empty means "any instance may write": then every instance heard from counts, and none is
    awaited before it is heard from.
    """

    __slots__ = (
        "_fetch_markers",
        "_finished_above",
        "_instance",
        "_is_writer",
        "_known_finished",
        "_local",
        "_max_seen",
        "_persisted_upto",
        "_positions",
        "_reported",
        "_settled",
        "_unfinished",
        "_unheard",
        "_unheard_floor",
        "_writers",
        "version",
    )

    def __init__(
        self,
        instance_name: str,
        writers: Iterable[str],
        *,
        persisted_upto: int,
        positions: Mapping[str, int] | None = None,
        own_position: int | None = None,
    ) -> None:
        """Start from loaded state.

        `positions`: other writers' last known positions (e.g. from `stream_positions`); entries for
        instances outside a non-empty `writers` are ignored. `own_position`: where this instance is
        (a writer: the sequence's max allocated, since it has allocated nothing yet); defaults to
        `persisted_upto`. Raises ValueError on inconsistent input.
        """
        if persisted_upto < 0:
            raise ValueError(f"persisted_upto must be >= 0, got {persisted_upto}")
        self._instance = instance_name
        self._writers = frozenset(writers)
        self._is_writer = not self._writers or instance_name in self._writers
        self._persisted_upto = persisted_upto
        self._positions: dict[str, int] = {}
        for name, pos in (positions or {}).items():
            if name == instance_name or (self._writers and name not in self._writers):
                continue
            self._positions[name] = max(pos, persisted_upto)
        self._unheard = {w for w in self._writers if w != instance_name and w not in self._positions}
        self._unheard_floor = persisted_upto
        self._local = max(own_position if own_position is not None else persisted_upto, persisted_upto)
        if self._is_writer:
            self._positions[instance_name] = self._local
        self._max_seen = max([persisted_upto, self._local, *self._positions.values()])
        self._reported = self._max_seen if self._is_writer else self._local
        self._unfinished: set[int] = set()
        self._finished_above: set[int] = set()
        self._fetch_markers: list[int] = []
        # Heap of (first, last): runs of consecutive IDs finished here, not yet below persisted-upto.
        self._known_finished: list[tuple[int, int]] = []
        #: Changes whenever a position or persisted-upto may have (unique across books).
        self.version = next(_VERSIONS)
        self._settled = False  # `_update` has not run yet: the loaded state may not be its fixed point

    # -- reads -------------------------------------------------------------------------------------

    @property
    def instance_name(self) -> str:
        return self._instance

    @property
    def is_writer(self) -> bool:
        return self._is_writer

    @property
    def persisted_upto(self) -> int:
        """Every ID at or below this, from any writer, has finished."""
        return self._persisted_upto

    @property
    def max_seen(self) -> int:
        """The highest ID this process has allocated or heard of."""
        return self._max_seen

    @property
    def busy(self) -> bool:
        """True while this instance has IDs (or an allocation) in flight."""
        return bool(self._unfinished or self._fetch_markers)

    def own_position(self) -> int:
        """What this instance announces and persists for itself (see the module docstring); monotone."""
        return self._reported

    def minimal_local_position(self) -> int:
        """This instance's own last contiguous finished write, not raised by other writers."""
        return self._positions.get(self._instance, self._persisted_upto)

    def position_of(self, instance: str) -> int:
        """The maximal safe view of `instance`'s position: never below persisted-upto."""
        if instance == self._instance and self._is_writer:
            return max(self._reported, self._persisted_upto)
        return max(self._positions.get(instance, self._persisted_upto), self._persisted_upto)

    def positions(self) -> dict[str, int]:
        """Each writer's own position as last known (this instance: `minimal_local_position`)."""
        return dict(self._positions)

    def unheard_writers(self) -> frozenset[str]:
        """Configured writers not heard from since start-up (they hold back persisted-upto)."""
        return frozenset(self._unheard)

    def in_flight(self) -> frozenset[int]:
        return frozenset(self._unfinished)

    # -- allocation and completion -----------------------------------------------------------------

    def begin_allocation(self) -> int:
        """Call before asking the sequence for IDs; returns a marker for `end_allocation`."""
        marker = self._max_seen
        self._fetch_markers.append(marker)
        return marker

    def end_allocation(self, marker: int, ids: Sequence[int]) -> None:
        """The allocation that `marker` stands for returned `ids` (empty if it failed: a harmless gap)."""
        self._fetch_markers.remove(marker)
        if ids:
            lowest = min(ids)
            if lowest <= marker:
                raise InconsistentSequenceError(
                    f"the sequence handed out ID {lowest}, not above the highest ID already seen ({marker}): "
                    "it was moved backwards; stop all writers and setval it past every used ID"
                )
            self._unfinished.update(ids)
            highest = max(ids)
            if highest > self._max_seen:
                self._max_seen = highest
            if self._settled and not self._finished_above:
                # Busy since begin_allocation and still busy, no finished ID waiting for this marker, and
                # `_update` has run since the last change: it would change nothing now.
                return
        self._update(())

    def finish(self, ids: Iterable[int]) -> None:
        """`ids` (allocated here) have finished, committed or not. Finishing twice is a no-op."""
        unfinished = self._unfinished
        done = unfinished.intersection(ids)
        unfinished.difference_update(done)
        if done and self._is_writer and not (self._finished_above or unfinished or self._fetch_markers):
            # Idle now with nothing older waiting: what `_update_local` would do, without the set.
            self._local = max(self._local, max(done))
            self._positions[self._instance] = self._local
        else:
            self._finished_above.update(done)
        self._update(done)

    def advance(self, instance: str, position: int) -> None:
        """Another writer reported `position` (RDATA or POSITION). Never moves anything backwards."""
        if instance == self._instance:
            # Our own echo carries nothing we do not know; our position is ours to compute.
            return
        old = self._positions.get(instance)
        if old is None or position > old:
            self._positions[instance] = position
        self._unheard.discard(instance)
        if position > self._max_seen:
            self._max_seen = position
        self._update(())

    def set_writers(self, writers: Iterable[str]) -> None:
        """The configured writers changed while this process runs (a config reload). A writer
        added and not heard yet counts at today's persisted-upto (the "new writer" rule: it has
        allocated nothing yet, so every ID at or below that is finished without it). A writer
        removed stops counting: call this only once it can write no more (its name is fenced).
        This instance's own role never changes here."""
        new = frozenset(writers)
        if self._writers and not new:
            raise ValueError("a stream with writers cannot become open (writers=[]) while running")
        added = {w for w in new - self._writers if w != self._instance and w not in self._positions}
        if added and not self._unheard:
            self._unheard_floor = self._persisted_upto
        self._unheard = (self._unheard & new) | added
        self._writers = new | ({self._instance} if self._is_writer and self._writers else frozenset())
        self._update(())

    # -- internals ---------------------------------------------------------------------------------

    def _update(self, finished_now: Collection[int]) -> None:
        """`finished_now`: distinct IDs this process has just finished (empty when nothing finished)."""
        if self._is_writer:
            self._update_local()
        persisted = self._persisted_upto
        floor = self._linear_floor()
        if floor is not None and floor > persisted:
            persisted = floor
        known = self._known_finished
        if finished_now and max(finished_now) > persisted:
            for first, last in _runs(finished_now):
                if last <= persisted:
                    continue
                if first <= persisted + 1:
                    persisted = last
                else:
                    heapq.heappush(known, (first, last))
        while known and known[0][0] <= persisted + 1:
            last = heapq.heappop(known)[1]
            if last > persisted:
                persisted = last
        if len(known) > MAX_KNOWN_FINISHED:
            known.clear()
        self._persisted_upto = persisted
        if self._is_writer:
            reported = max(self._reported, self._local, persisted)
            if not (self._unfinished or self._fetch_markers):
                reported = max(reported, self._max_seen)
            self._reported = reported
        self._settled = True
        self.version = next(_VERSIONS)

    def _update_local(self) -> None:
        finished = self._finished_above
        if not finished:
            return
        if not (self._unfinished or self._fetch_markers):
            self._local = max(self._local, max(finished))
            finished.clear()
        else:
            bound = min(self._unfinished) if self._unfinished else self._max_seen + 1
            if self._fetch_markers:
                bound = min(bound, min(self._fetch_markers) + 1)
            below = [i for i in finished if i < bound]
            if not below:
                return
            self._local = max(self._local, max(below))
            finished.difference_update(below)
        self._positions[self._instance] = self._local

    def _linear_floor(self) -> int | None:
        """The minimum over all writers' positions (this instance's own counted as described above)."""
        writers = self._writers
        me = self._instance
        candidates = [
            p for name, p in self._positions.items() if name != me and (not writers or name in writers)
        ]
        if self._unheard:
            candidates.append(self._unheard_floor)
        if self._is_writer:
            busy = self._unfinished or self._fetch_markers
            candidates.append(max(self._reported, self._local) if busy else self._max_seen)
        return min(candidates) if candidates else None


def _runs(ids: Collection[int]) -> list[tuple[int, int]]:
    """Distinct `ids` as ascending runs of consecutive values, (first, last) each."""
    first, last = min(ids), max(ids)
    if last - first == len(ids) - 1:  # distinct: one run (e.g. a batch from one nextval query)
        return [(first, last)]
    ordered = sorted(ids)
    runs: list[tuple[int, int]] = []
    prev = first
    for i in ordered[1:]:
        if i != prev + 1:
            runs.append((first, prev))
            first = i
        prev = i
    runs.append((first, prev))
    return runs
