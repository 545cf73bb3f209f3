"""The context managers an allocation of stream IDs is held by, and what they carry.

`Allocation` is what `get_next` / `get_next_mult` return: the IDs on entry, finished on exit.
`Ride` is an allocation whose round trip is another statement's (`ride_mult`, `Ride.carry`). Both
only call their generator (`idgen.multi_writer`), which holds the state, the lane and the SQL;
`Probe` is the look-up an allocation may make in its own statement. No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from idgen.errors import InconsistentSequenceError


@dataclass(frozen=True, slots=True)
class Probe:
    """Values to look up in a unique text column in the allocation's own statement: IDs are then
    taken only for the values not found (`get_next_mult(n, probe=...)`). For writes that may be
    retries of stored ones: they cost no ID and no round trip of their own."""

    table: str
    column: str
    values: Sequence[str]


class Allocator(Protocol):
    """What an allocation block calls of its generator (`MultiWriterIdGenerator`, which imports
    this module: the generator is not imported here)."""

    _sign: int

    async def _allocate(self, n: int, probe: Probe | None = None) -> tuple[Sequence[int], frozenset[str]]: ...

    async def _allocate_with(
        self, conn: Any, host_sql: str, host_args: Sequence[object], n: int, probe: Probe | None
    ) -> tuple[Sequence[int], frozenset[str], int, InconsistentSequenceError | None]: ...

    async def _complete(self, ids: Sequence[int], *, failed: bool) -> None: ...


class Allocation:
    """The context manager returned by `get_next` / `get_next_mult`."""

    __slots__ = ("_count", "_gen", "_ids", "_probe", "_single", "found")

    def __init__(self, gen: Allocator, count: int, single: bool, probe: Probe | None = None) -> None:
        self._gen = gen
        self._count = count
        self._single = single
        self._probe = probe
        self._ids: Sequence[int] = ()
        #: The probe's values found in its column (no ID was taken for them).
        self.found: frozenset[str] = frozenset()

    async def __aenter__(self) -> Any:
        ids, self.found = await self._gen._allocate(self._count, self._probe)
        self._ids = ids
        sign = self._gen._sign
        if self._single:
            return sign * ids[0]
        if sign == 1:
            return list(ids)  # a copy: the caller may change it, `_complete` finishes the IDs we got
        return [-i for i in ids]

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._gen._complete(self._ids, failed=exc_type is not None)


class Ride(Allocation):
    """An allocation carried by another statement's round trip (`MultiWriterIdGenerator.ride_mult`).

    `carry(conn, host_sql, host_args)` runs the caller's data-modifying statement with the
    allocation (and the probe, and a delayed position upsert) in one statement on the caller's
    connection. The IDs are then in flight as if `get_next_mult` had taken them: `async with ride
    as ids` hands them out with no I/O and finishes them on exit, as `get_next_mult`'s block does.
    What the host statement writes and what the allocation takes share one round trip, not one
    transaction: when the statement fails, IDs it may have taken are unknown and stay harmless gaps
    (nothing is written with them). A carried ride that is never entered must be `discard`ed."""

    __slots__ = ("_carried", "_entered", "_error")

    def __init__(self, gen: Allocator, count: int, probe: Probe | None = None) -> None:
        super().__init__(gen, count, False, probe)
        self._carried = False
        self._entered = False
        self._error: InconsistentSequenceError | None = None

    @property
    def carried(self) -> bool:
        """Whether `carry` returned: the IDs are allocated and in flight."""
        return self._carried

    async def carry(self, conn: Any, host_sql: str, host_args: Sequence[object]) -> int:
        """Run `host_sql` (one INSERT, UPDATE or DELETE whose parameters are $1 to
        $len(host_args), without RETURNING) with this allocation in the same statement; how many
        rows it wrote. Raises what the statement raises (then nothing is allocated)."""
        if self._carried:
            raise RuntimeError("this ride was carried already")
        self._ids, self.found, written, self._error = await self._gen._allocate_with(
            conn, host_sql, host_args, self._count, self._probe
        )
        self._carried = True
        return written

    async def __aenter__(self) -> Any:
        if not self._carried or self._entered:
            raise RuntimeError("enter a ride once, after `carry`")
        self._entered = True
        if self._error is not None:
            raise self._error
        sign = self._gen._sign
        return list(self._ids) if sign == 1 else [-i for i in self._ids]

    async def discard(self) -> None:
        """Finish the IDs of a carried ride that was never entered (they stay gaps); else nothing."""
        if self._carried and not self._entered:
            self._entered = True
            await self._gen._complete(self._ids, failed=True)
