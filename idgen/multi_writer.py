"""`MultiWriterIdGenerator`: stream IDs from a shared Postgres sequence, positions in `stream_positions`.

The asyncpg edge around `idgen.positions.StreamPositions` (which holds every rule). On the database:

* `get_next()` / `get_next_mult(n)`: one round trip to allocate (`nextval`, n times in one query), then on
  exit the IDs are finished, the `on_finished` listener is called (the replication publisher: readers
  learn the position without waiting for what follows), and one autocommit upsert of this writer's own
  position into `stream_positions` (forward only) is done before the block returns. Concurrent
  completions share an upsert when one is already in flight. With `position_delay_s` (the events
  stream of a persister) the block returns without it: the next allocation's statement carries the
  upsert (`WITH ... INSERT ... SELECT nextval`), or a timer does when the writer goes idle.
  `ride_mult(n)` takes the IDs in the round trip of a statement the caller sends anyway (`Ride.carry`:
  the caller's INSERT and the allocation, one statement on the caller's connection), with the same
  in-flight bookkeeping; the events persister allocates its next batch so.
  Nothing else. The statements run on a few connections the generator keeps from the pool while it is
  busy (returned after `IDLE_RELEASE_S` of idleness, or by `close()`), because every pool
  acquire/release costs a reset round trip.
* Start-up (`create`): MIN/MAX of each stream table (index-backed aggregates: one row read per table,
  never a scan), the sequence state, the `stream_positions` rows of the stream, and for a writer one
  upsert of its own position (plus deleting rows of instances no longer configured as writers).

Start-up (the positions read, checked and repaired, and where we differ from Synapse):
`idgen.startup`.

Over 500 lines: the allocation, the finishing of IDs and the position upserts share the generator's
state and its few connections, and their interleavings (an upsert riding on the next allocation,
a timer taking over when idle) read best in one place; the rules are `idgen.positions`, the
connections `idgen._lane`.

Assumptions: instance names are unique among running processes, and a restarted instance's previous
process is dead. Remove a writer from `writers` (`set_writers`, at run time) only once it can write no more.

Allocation and completion stay in one module: they share the positions' invariants and the lane,
and reading them apart would hide how they meet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

import asyncpg

from idgen._lane import Lane
from idgen.allocation import Allocation, Probe, Ride
from idgen.errors import InconsistentSequenceError, NotAWriterError
from idgen.positions import StreamPositions
from idgen.sequence_reads import SequenceReads
from idgen.startup import StartupRead, StreamTable, load_positions

log = logging.getLogger(__name__)

#: A lane's connection goes back to the pool after this long unused. A second: a persister taking a
#: few sends a second (0.2-0.5 s apart) kept giving its connections back between them and taking
#: them again (a timer, a release and an acquire each time: about half a context switch per event
#: at 10 events/s, `fanout bench live`).
IDLE_RELEASE_S = 1.0
#: How long `close()` waits for a delayed position upsert.
CLOSE_UPSERT_S = 2.0
#: What an unreachable or restarting PostgreSQL raises: a lost link, a terminated backend, a refused
#: or timed-out connection attempt. InternalClientError too: a backend terminated while its
#: connection sat idle leaves asyncpg's protocol waiting for a sync point ("another operation (2)
#: is in progress") until it sees the socket close, and the pool may hand it out meanwhile.
DATABASE_DOWN: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
    asyncpg.InsufficientResourcesError,
)
#: What a worker's periodic loop (a lease's keep-alive, a check, a retirement) logs and tries again
#: next turn: the database away, or any statement refused by it. A narrower list let a stuck
#: connection's InternalClientError end such a loop for good.
DATABASE_ERRORS: tuple[type[Exception], ...] = (asyncpg.PostgresError, *DATABASE_DOWN)
#: The names its lane's statements are timed under (as a pool block would be named).
_ALLOCATE = f"{__name__}.MultiWriterIdGenerator._allocate"
_UPSERT = f"{__name__}.MultiWriterIdGenerator._persist_own_position"
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$")


def _ident(name: str) -> str:
    if not _IDENT.match(name):
        raise ValueError(f"{name!r} is not a plain lower-case SQL identifier")
    return name


def probe_lookup_sql(probe: Probe, param: int) -> str:
    """The values of text array parameter `param` that `probe`'s unique column holds, once each.

    Each value is looked up on its own (a scalar subquery per value, which PostgreSQL never turns
    into a join), so every plan of it reads the unique index. The statement is prepared and kept:
    `column = ANY($n)` got a generic plan while the table was small (a new database, before its
    first ANALYZE), a sequential scan, and kept it as the table grew: 3 ms an allocation at
    9,000 events in `fanout bench peer`, growing with every event, until autovacuum analysed it."""
    table, column = _ident(probe.table), _ident(probe.column)
    return (
        f"SELECT v FROM (SELECT DISTINCT unnest(${param}::text[]) AS v) AS probed"
        f" WHERE (SELECT true FROM {table} WHERE {column} = probed.v)"
    )


class MultiWriterIdGenerator:
    """Hands out stream IDs for one stream from a shared sequence and tracks every writer's position.

    Create with `await MultiWriterIdGenerator.create(...)`; `await close()` when done (otherwise the
    connections it keeps go back to the pool after `IDLE_RELEASE_S` of idleness). All positions and IDs
    are signed: negative streams (`positive=False`) hand out -1, -2, ... and report negated positions.
    """

    __slots__ = (
        "_book",
        "_instance",
        "_known_max",
        "_lane",
        "_pool",
        "_position_delay",
        "_position_task",
        "_position_timer",
        "_probe_sql",
        "_reads",
        "_ride_sql",
        "_sequence",
        "_sign",
        "_sql_next",
        "_sql_next_mult",
        "_sql_next_upsert",
        "_sql_upsert",
        "_stored",
        "_stream_name",
        "_tables",
        "_track",
        "_upsert_busy",
        "_upsert_done",
        "_writers",
        "on_finished",
        "timed",
    )

    _book: StreamPositions
    _instance: str
    #: The highest value the sequence is known to have reached (internal, positive): this process's
    #: own allocations and its reads of the sequence. No I/O to read it (`known_allocated_token`).
    _known_max: int
    _lane: Lane
    _pool: asyncpg.Pool[asyncpg.Record]
    _reads: SequenceReads
    #: Called (no arguments; must neither block nor raise) each time a block's IDs finish, before the position
    #: upsert, as Synapse notifies replication: a position published before `stream_positions`
    #: holds it is sound, since a stale row only ever holds a reader's start-up position back.
    on_finished: Callable[[], None] | None
    #: Called with (name, seconds) after each statement on the generator's own connections (its
    #: lane: the sequence and the position upsert), which no pool block times; None: not timed.
    timed: Callable[[str, float], None] | None
    _sequence: str
    _sign: int
    _sql_next: str
    _sql_next_mult: str
    _sql_next_upsert: str
    _sql_upsert: str
    #: 0: a block's exit upserts `stream_positions` before it returns. Above 0: it does not wait;
    #: the next allocation's statement carries the upsert, or a timer this many seconds later does.
    _position_delay: float
    _position_timer: asyncio.TimerHandle | None
    _position_task: asyncio.Task[None] | None
    #: (table, column, carries the upsert) -> the allocation statement with that probe.
    _probe_sql: dict[tuple[str, str, bool], str]
    #: (host statement, its parameter count, probe (table, column), carries the upsert) -> `Ride` SQL.
    _ride_sql: dict[tuple[str, int, tuple[str, str] | None, bool], str]
    _stored: int
    _stream_name: str
    _tables: tuple[StreamTable, ...]
    _track: bool
    _upsert_busy: bool
    _upsert_done: asyncio.Future[None] | None
    _writers: tuple[str, ...]

    def __init__(self) -> None:
        raise TypeError("use `await MultiWriterIdGenerator.create(...)`")

    @classmethod
    async def create(
        cls,
        pool: asyncpg.Pool[asyncpg.Record],
        *,
        stream_name: str,
        instance_name: str,
        tables: Sequence[tuple[str, str, str]],
        sequence_name: str,
        writers: Sequence[str],
        positive: bool = True,
        track_positions_table: bool = True,
        max_connections: int = 2,
        position_delay_s: float = 0.0,
        sequence_reads: SequenceReads | None = None,
    ) -> MultiWriterIdGenerator:
        """Check the sequence against the tables and `stream_positions`, load positions, and return.

        `writers` empty means anyone may write (only allowed with `track_positions_table=False`).
        `position_delay_s` > 0: a block's exit does not wait for the `stream_positions` upsert; the
        next allocation carries it in its own statement (no round trip of its own while busy), or,
        when none comes, an upsert `position_delay_s` later does. The row then lags by up to that
        long, which is sound: a stale row only holds a reader's start-up position back.
        `sequence_reads`: shared by the generators of one pool, so that their sequence reads share
        statements (`idgen.sequence_reads`); a generator without one reads alone.
        Raises InconsistentSequenceError when `stream_positions` is ahead of the sequence.
        """
        if not tables:
            raise ValueError("a stream needs at least one table")
        if not writers and track_positions_table:
            raise ValueError(
                f"stream {stream_name!r}: an open stream (writers=[]) cannot track positions; "
                "pass track_positions_table=False or list its writers"
            )
        self = object.__new__(cls)
        self._pool = pool
        self._stream_name = stream_name
        self._instance = instance_name
        self._sequence = _ident(sequence_name)
        self._tables = tuple(StreamTable(*(_ident(part) for part in t)) for t in tables)
        self._writers = tuple(writers)
        self._sign = 1 if positive else -1
        self._track = track_positions_table
        self._lane = Lane(pool, max_connections, IDLE_RELEASE_S)
        self._stored = 0
        self._known_max = 0
        self._reads = sequence_reads or SequenceReads(pool)
        self._reads.register(self._sequence, self._learn_max)
        self._position_delay = position_delay_s
        self._position_timer = None
        self._position_task = None
        self._probe_sql = {}
        self._ride_sql = {}
        self._upsert_busy = False
        self._upsert_done = None
        self.on_finished = self.timed = None
        seq = self._sequence
        self._sql_next = f"SELECT nextval('{seq}')"
        self._sql_next_mult = f"SELECT nextval('{seq}') FROM generate_series(1, $1)"
        self._sql_upsert = self._upsert_sql(1)
        # A data-modifying WITH runs to completion whether or not the query reads it.
        self._sql_next_upsert = (
            f"WITH p AS ({self._sql_upsert}) SELECT nextval('{seq}') FROM generate_series(1, $4)"
        )
        async with pool.acquire() as conn:
            self._book, stored = await load_positions(
                conn, StartupRead(stream_name, instance_name, self._sequence, self._tables, self._writers,
                                  self._sign, track_positions_table, self._sql_upsert),
            )  # fmt: skip
        self._stored = stored
        return self

    def _upsert_sql(self, first: int) -> str:
        """The forward-only upsert of this writer's position, its parameters numbered from `first`."""
        a, b, c = first, first + 1, first + 2
        return (
            f"INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES (${a}, ${b}, ${c})"
            " ON CONFLICT (stream_name, instance_name) DO UPDATE SET stream_id = EXCLUDED.stream_id"
            f" WHERE stream_positions.stream_id {'<' if self._sign == 1 else '>'} EXCLUDED.stream_id"
        )

    # -- allocation --------------------------------------------------------------------------------

    def get_next(self) -> Allocation:
        """`async with gen.get_next() as stream_id:` allocates one ID; the ID finishes when the block exits
        (normally, by exception or by cancellation). Raises NotAWriterError on a non-writer."""
        return Allocation(self, 1, True)

    def get_next_mult(self, n: int, *, probe: Probe | None = None) -> Allocation:
        """`async with gen.get_next_mult(n) as ids:` allocates `n` IDs (ascending) in one round trip.
        With a `probe` of up to `n` values, the same statement looks them up: `n` minus the number
        found are allocated, and the allocation's `found` holds the values found."""
        if n < 1:
            raise ValueError(f"get_next_mult needs n >= 1, got {n}")
        if probe is not None and not 0 < len(probe.values) <= n:
            raise ValueError(f"a probe looks up 1 to n={n} values, got {len(probe.values)}")
        return Allocation(self, n, False, probe)

    def ride_mult(self, n: int, *, probe: Probe | None = None) -> Ride:
        """`n` IDs (ascending) as `get_next_mult` takes them, but in the round trip of a statement
        the caller runs anyway (`Ride.carry`). The caller keeps allocations in order as it would
        with `get_next_mult`: a ride counts as allocated once `carry` returned."""
        if n < 1:
            raise ValueError(f"ride_mult needs n >= 1, got {n}")
        if probe is not None and not 0 < len(probe.values) <= n:
            raise ValueError(f"a probe looks up 1 to n={n} values, got {len(probe.values)}")
        return Ride(self, n, probe)

    def _sql_ride(self, host_sql: str, k: int, probe: Probe | None, carried: bool) -> str:
        key = (host_sql, k, None if probe is None else (probe.table, probe.column), carried)
        sql = self._ride_sql.get(key)
        if sql is None:
            ctes = [f"host AS ({host_sql} RETURNING 1)"]
            if carried:
                ctes.append(f"p AS ({self._upsert_sql(k + 1)})")
                k += 3
            count = f"${k + 1}::int"
            if probe is not None:
                ctes.append(f"found AS ({probe_lookup_sql(probe, k + 2)})")
                count += " - (SELECT count(*) FROM found)::int"
            # Rows by kind: 0 the host's count, 1 an ID, 2 a value the probe found.
            sql = (
                f"WITH {', '.join(ctes)} SELECT 0, (SELECT count(*) FROM host), NULL::text"
                f" UNION ALL SELECT 1, nextval('{self._sequence}'), NULL FROM generate_series(1, {count})"
                f"{' UNION ALL SELECT 2, NULL, v FROM found' if probe is not None else ''}"
            )
            self._ride_sql[key] = sql
        return sql

    async def _allocate_with(
        self, conn: Any, host_sql: str, host_args: Sequence[object], n: int, probe: Probe | None
    ) -> tuple[Sequence[int], frozenset[str], int, InconsistentSequenceError | None]:
        """`_allocate` inside the caller's statement, on the caller's connection: (IDs, values the
        probe found, rows the host statement wrote, the error that makes the IDs unusable). The
        host's rows stand whatever the IDs turn out to be, so a sequence found moved backwards is
        returned, for the ride to raise when entered, rather than raised here."""
        book = self._book
        if not book.is_writer:
            raise NotAWriterError(
                f"instance {self._instance!r} is not a writer of stream {self._stream_name!r} "
                f"(writers: {list(self._writers)}); add it to the stream's writers to allocate IDs"
            )
        marker = book.begin_allocation()
        try:
            carried = self._carried_position()
            args: list[object] = [*host_args]
            if carried is not None:
                args += (self._stream_name, self._instance, self._sign * carried)
            args.append(n)
            if probe is not None:
                args.append(probe.values)
            sql = self._sql_ride(host_sql, len(host_args), probe, carried is not None)
            rows = await conn.fetch(sql, *args)
        except BaseException:
            book.end_allocation(marker, ())
            raise
        taken: list[int] = []
        found: list[str] = []
        written = 0
        for kind, value, text in rows:
            if kind == 1:
                taken.append(value)
            elif kind == 2:
                found.append(text)
            else:
                written = value
        ids = sorted(taken)
        try:
            book.end_allocation(marker, ids)
        except InconsistentSequenceError as e:
            return (), frozenset(), written, e
        if ids and ids[-1] > self._known_max:
            self._known_max = ids[-1]
        if carried is not None and carried > self._stored:
            self._stored = carried
        return ids, frozenset(found), written, None

    def _sql_probe(self, probe: Probe, carried: bool) -> str:
        key = (probe.table, probe.column, carried)
        sql = self._probe_sql.get(key)
        if sql is None:
            k = 4 if carried else 1
            found = f"found AS ({probe_lookup_sql(probe, k + 1)})"
            sql = (
                f"WITH {f'p AS ({self._sql_upsert}), ' if carried else ''}{found}"
                f" SELECT nextval('{self._sequence}'), NULL::text"
                f" FROM generate_series(1, ${k}::int - (SELECT count(*) FROM found)::int)"
                " UNION ALL SELECT NULL, v FROM found"
            )
            self._probe_sql[key] = sql
        return sql

    async def _allocate(self, n: int, probe: Probe | None = None) -> tuple[Sequence[int], frozenset[str]]:
        book = self._book
        if not book.is_writer:
            raise NotAWriterError(
                f"instance {self._instance!r} is not a writer of stream {self._stream_name!r} "
                f"(writers: {list(self._writers)}); add it to the stream's writers to allocate IDs"
            )
        marker = book.begin_allocation()
        ids: Sequence[int] = ()
        found: frozenset[str] = frozenset()
        try:
            conn = self._lane.acquire_idle()
            if conn is None:
                conn = await self._lane.acquire()
            started = perf_counter()
            carried = self._carried_position()
            try:
                if probe is not None:
                    upsert = (
                        () if carried is None else (self._stream_name, self._instance, self._sign * carried)
                    )
                    rows = await conn.fetch(
                        self._sql_probe(probe, carried is not None), *upsert, n, probe.values
                    )
                    ids = sorted(r[0] for r in rows if r[0] is not None)
                    found = frozenset(r[1] for r in rows if r[1] is not None)
                elif carried is not None:
                    args = (self._stream_name, self._instance, self._sign * carried, n)
                    ids = [r[0] for r in await conn.fetch(self._sql_next_upsert, *args)]
                elif n == 1:
                    ids = (int(await conn.fetchval(self._sql_next)),)
                else:
                    # asyncpg decodes bigint to int already
                    ids = [r[0] for r in await conn.fetch(self._sql_next_mult, n)]
            except BaseException:
                self._lane.discard(conn)
                raise
            self._lane.release(conn)
            if self.timed is not None:
                self.timed(_ALLOCATE, perf_counter() - started)
            top = max(ids, default=0)
            if top > self._known_max:
                self._known_max = top
            if carried is not None and carried > self._stored:
                self._stored = carried
        finally:
            book.end_allocation(marker, ids)
        return ids, found

    def _carried_position(self) -> int | None:
        """The own position an allocation should upsert in its statement (delayed mode, not yet
        stored, no upsert of its own in flight), else None."""
        if not self._position_delay or not self._track or self._upsert_busy:
            return None
        value = self._book.own_position()
        return value if value > self._stored else None

    def _schedule_position(self) -> None:
        """Delayed mode: upsert the own position in `position_delay_s` unless an allocation carries
        it first (then the timer finds nothing to do); while the writer stays busy the timer waits
        on, so a busy writer upserts only inside its allocations."""
        if self._position_timer is None and self._book.own_position() > self._stored:
            loop = asyncio.get_running_loop()
            self._position_timer = loop.call_later(self._position_delay, self._position_due)

    def _position_due(self) -> None:
        self._position_timer = None
        if self._book.busy:  # an allocation or a block in flight: the next allocation carries it
            self._schedule_position()
            return
        if self._book.own_position() > self._stored and self._position_task is None:
            self._position_task = asyncio.get_running_loop().create_task(self._delayed_upsert())

    async def _delayed_upsert(self) -> None:
        try:
            await self._persist_own_position()
        except Exception as e:  # the row stays stale (sound); the next completion schedules again
            log.warning(
                "position upsert failed, the next write retries it: stream=%s error=%s: %s",
                self._stream_name, type(e).__name__, e,
            )  # fmt: skip
        finally:
            self._position_task = None

    async def _complete(self, ids: Sequence[int], *, failed: bool) -> None:
        self._book.finish(ids)
        if self.on_finished is not None:
            self.on_finished()
        if not self._track:
            return
        if self._position_delay:
            self._schedule_position()
            return
        try:
            if not failed:
                await self._persist_own_position()
                return
            # The block is unwinding (error or cancellation): still try to persist, in a task a
            # second cancellation cannot interrupt, but never let this replace the exception raised.
            await asyncio.shield(asyncio.ensure_future(self._persist_own_position()))
        except DATABASE_DOWN as e:
            # The IDs are finished and published: a stale row only holds readers' start-up
            # positions back, and the next completion upserts again. The write itself stands.
            log.warning(
                "position upsert failed, the next write retries it: stream=%s error=%s: %s",
                self._stream_name, type(e).__name__, e,
            )  # fmt: skip
        except Exception as e:
            if not failed:
                raise
            log.warning(
                "position upsert failed after a failed write: stream=%s error=%s: %s",
                self._stream_name, type(e).__name__, e,
            )  # fmt: skip

    async def _persist_own_position(self) -> None:
        """Return once `stream_positions` holds at least our own position as of the call."""
        target = self._book.own_position()
        while self._stored < target:
            if self._upsert_busy:
                # Created only when someone waits: the uncontended path allocates no future.
                waiter = self._upsert_done
                if waiter is None:
                    waiter = self._upsert_done = asyncio.get_running_loop().create_future()
                await asyncio.shield(waiter)
                continue
            self._upsert_busy = True
            try:
                value = self._book.own_position()
                conn = self._lane.acquire_idle()
                if conn is None:
                    conn = await self._lane.acquire()
                started = perf_counter()
                try:
                    await conn.execute(
                        self._sql_upsert, self._stream_name, self._instance, self._sign * value
                    )
                except BaseException:
                    self._lane.discard(conn)
                    raise
                self._lane.release(conn)
                if self.timed is not None:
                    self.timed(_UPSERT, perf_counter() - started)
                if value > self._stored:
                    self._stored = value
            finally:
                self._upsert_busy = False
                waiter, self._upsert_done = self._upsert_done, None
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

    # -- positions ---------------------------------------------------------------------------------

    def get_current_token(self) -> int:
        """The persisted-upto position: every ID at or below it, from any writer, is persisted."""
        return self._sign * self._book.persisted_upto

    def get_persisted_upto_position(self) -> int:
        """Same as `get_current_token`."""
        return self._sign * self._book.persisted_upto

    def get_current_token_for_writer(self, instance_name: str) -> int:
        """The maximal safe position of a writer (never below persisted-upto; this instance: what it
        announces, which follows other writers while it is idle)."""
        return self._sign * self._book.position_of(instance_name)

    def get_minimal_local_current_token(self) -> int:
        """This instance's own last contiguous finished write, not raised by other writers."""
        return self._sign * self._book.minimal_local_position()

    @property
    def positions_version(self) -> int:
        """Changes whenever `get_current_token` or `get_positions` may answer differently (a
        reader's memo of a token built from them stays right while it does not)."""
        return self._book.version

    def get_positions(self) -> dict[str, int]:
        """Each writer's own position as last known (never raised to persisted-upto); writers never
        heard from are absent."""
        sign = self._sign
        return {name: sign * pos for name, pos in self._book.positions().items()}

    async def get_max_allocated_token(self) -> int:
        """The highest ID ever handed out by anyone, in-flight IDs included (reads the sequence, in
        one statement with the reads the pool's other generators ask for in the same turn:
        `idgen.sequence_reads`)."""
        await self._reads.read(self._sequence)  # `_learn_max` has raised `_known_max` to it
        return self._sign * self._known_max

    def _learn_max(self, value: int) -> None:
        if value > self._known_max:
            self._known_max = value

    def known_allocated_token(self) -> int:
        """A lower bound of `get_max_allocated_token` without I/O: the highest ID this process
        allocated itself or read from the sequence (0 before either). Every token at or below it
        was handed out, so a line claiming one needs no read of the sequence."""
        return self._sign * self._known_max

    def advance(self, instance_name: str, new_id: int) -> None:
        """Record that `instance_name` reached `new_id` (signed, as received in RDATA or POSITION)."""
        self._book.advance(instance_name, self._sign * new_id)

    def set_writers(self, writers: Sequence[str]) -> None:
        """Follow a change of the stream's writers while running (`StreamPositions.set_writers`:
        remove a writer only once it can write no more)."""
        self._book.set_writers(writers)
        self._writers = tuple(writers)

    # -- misc --------------------------------------------------------------------------------------

    @property
    def stream_name(self) -> str:
        return self._stream_name

    @property
    def instance_name(self) -> str:
        return self._instance

    @property
    def writers(self) -> tuple[str, ...]:
        return self._writers

    @property
    def positive(self) -> bool:
        return self._sign == 1

    async def close(self) -> None:
        """Upsert a position still waiting for its delay (best effort), then give the kept
        connections back to the pool. Further `get_next` calls raise IdGenError."""
        if self._position_timer is not None:
            self._position_timer.cancel()
            self._position_timer = None
            if self._position_task is None:
                self._position_task = asyncio.get_running_loop().create_task(self._delayed_upsert())
        if self._position_task is not None:
            with contextlib.suppress(TimeoutError):  # a database that is gone must not hold shutdown
                await asyncio.wait_for(asyncio.shield(self._position_task), CLOSE_UPSERT_S)
        await self._lane.close()

    def __repr__(self) -> str:
        book = self._book
        return (
            f"<MultiWriterIdGenerator stream={self._stream_name} instance={self._instance} "
            f"persisted_upto={self.get_current_token()} "
            f"own={self.get_current_token_for_writer(self._instance)} "
            f"in_flight={len(book.in_flight())}>"
        )
