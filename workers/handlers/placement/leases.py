"""Which writer writes a key now: a lease row per key with an epoch, held while the holder's instance
lease lives (`workers.process.instance_lease`), the same fencing as the instance name. A key is a room
(`workers.handlers.placement.room_leases`) or one entity of a stored stream: a user's account data, device
list or to-device sends, a room's receipts (`stream_leases`, one row per (stream, entity)).

A writer writes a key only while it holds the key's lease under the epoch it took:
* `hold(key)` before a write: take the lease when the key has none, was released, is held under
  this name already (a new process of the same name fences the old one), or its holder's instance
  lease ended (crashed, frozen, cut off). A take raises the epoch, a key column (a unique index
  ends with it), so it waits for the old holder's writes in flight and fences later ones.
  Held by another live writer: `NotOwner` naming it (the caller goes there).
  While workers of the previous release run (`workers.process.previous_release`), only the writer the key
  hashes to takes it (`hashed_writer`); another answers `KeyMoving`, as they route by the hash.
* After a take from another writer, the hand-over point goes into the data. The new holder reads
  the key's last row (`last_write`: the writer and stream id of the newest row the key wrote) and
  makes every row of the old writer up to it final: its own view of the old writer covers it
  (announced: a writer announces only positions below which all its IDs completed), or does after
  a bounded wait while the old writer is heard, or else the old writer's instance lease has
  expired and the new holder fences it (`fence_expired`: it commits nothing more, anywhere; a
  frozen one stops when it wakes). Neither: `KeyMoving`. It then records the hand-over
  (`table.handovers`), and its rows name it (`after`, `workers.streams.handovers`): readers apply
  the old writer's rows up to there first, whether either came live or from the database, so one
  key's rows stay in stream order for every reader even when the old holder died before it
  published its last ones, and nobody waits for a writer that may never return.
* `check(conn, keys)`, inside the write's own transaction, reads the keys' rows `FOR KEY SHARE`
  (with the instance lease's check, in one statement) and fails (`KeyLeaseLost`) unless every one
  is still held under its epoch; a take waits for it.
* `release_all()` on a planned stop, once the writer drained and no commit outcome is left
  unknown: every held key is marked released (epoch unchanged: nothing of ours is in flight), and
  the next write to it, on another writer, takes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import asyncpg

from workers.errors import PersisterError, WorkerError
from workers.handlers.notify.notifier import Notifier
from workers.handlers.notify.visibility import WriterPositions, wait_visible
from workers.process.instance_lease import Fence, fence_expired
from workers.storage import Conn
from workers.storage.handovers import RECORD_STREAM

log = logging.getLogger(__name__)
#: The longest one write waits here to see the key's last row (its caller may try again).
SEEN_WAIT_S = 2.0


class NotOwner(WorkerError):
    """Another live writer holds the key: send the write to `holder`."""

    def __init__(self, key: str, holder: str) -> None:
        super().__init__(f"{key} is written by {holder}")
        self.key = key
        self.holder = holder


class KeyMoving(PersisterError):
    """The key was just taken from another writer whose last write this one has not seen yet, or
    this writer stops; nothing was done (try again shortly)."""


class KeyLeaseLost(PersisterError):
    """A key of the write was taken by another writer: the write did not commit."""


@dataclass(frozen=True, slots=True)
class LeaseTable:
    """Where one kind of lease lives, and its statements. `scope`: the (column, value) that picks
    this kind's rows in a table shared by several (`stream_leases.stream`), else None."""

    table: str
    key_column: str
    scope: tuple[str, str] | None = None
    #: The statement recording a take from another writer ($1 key, $2 writer, $3 epoch, $4 old
    #: writer, $5 its last row; then the scope's value).
    handovers: str = RECORD_STREAM

    def _scoped(self, param: int) -> str:
        return "" if self.scope is None else f" AND {self.scope[0]} = ${param}"

    def args(self, *args: Any) -> tuple[Any, ...]:
        """A statement's arguments: `args`, then the scope's value (its last parameter)."""
        return args if self.scope is None else (*args, self.scope[1])

    @property
    def take(self) -> str:
        """($1 key, $2 writer, $3 instance-lease prefix): the new epoch, or no row when another
        live writer holds the key."""
        columns, values, conflict = self.key_column, "$1", self.key_column
        if self.scope is not None:
            scope = self.scope[0]
            columns, values, conflict = f"{columns}, {scope}", "$1, $4", f"{scope}, {conflict}"
        return f"""
INSERT INTO {self.table} AS r ({columns}, writer, epoch, released) VALUES ({values}, $2, 1, false)
ON CONFLICT ({conflict}) DO UPDATE SET writer = $2, epoch = r.epoch + 1, released = false
WHERE r.released OR r.writer = $2 OR NOT EXISTS (
    SELECT 1 FROM instance_leases i WHERE i.lease_key = $3 || r.writer AND i.expires_at > now()
)
RETURNING r.epoch
"""

    @property
    def holder(self) -> str:
        """($1 key): the holder's name."""
        return f"SELECT writer FROM {self.table} WHERE {self.key_column} = $1{self._scoped(2)}"

    def check(self, *, fenced: bool, session: bool) -> str:
        """The write's check, one statement: the keys ($1 or, `fenced`, $3: the keys; then the
        writer) held under that name, locked, one row each (one row with no key when none is);
        `fenced`: with the instance lease's check (`Fence.CHECK`: $1, $2), its epoch on every row;
        `session`: with the transaction's id and backend (`commit_outcome.CURRENT_XID_SQL`)."""
        first = 3 if fenced else 1
        held = (
            f"SELECT {self.key_column} AS key, epoch FROM {self.table}"
            f" WHERE {self.key_column} = ANY(${first}::text[]) AND writer = ${first + 1}"
            f" AND NOT released{self._scoped(first + 2)} FOR KEY SHARE"
        )
        ctes, columns = [f"held AS ({held})"], ["held.key", "held.epoch"]
        if fenced:
            ctes.insert(0, f"me AS ({Fence.CHECK})")
            columns.append("(SELECT epoch FROM me) AS instance_epoch")
        if session:
            columns.append("txid_current() AS xid, pg_backend_pid() AS pid")
        return (
            f"WITH {', '.join(ctes)} SELECT {', '.join(columns)}"
            " FROM (SELECT 1) AS one LEFT JOIN held ON true"
        )

    @property
    def release(self) -> str:
        """($1 writer): every key it holds, released."""
        return f"UPDATE {self.table} SET released = true WHERE writer = $1 AND NOT released{self._scoped(2)}"


def stream_table(stream: str) -> LeaseTable:
    """Where a stored stream's leases live: one row per (stream, entity) in `stream_leases`."""
    return LeaseTable("stream_leases", "entity", ("stream", stream), RECORD_STREAM)


class KeyLeases:
    """The keys this writer holds (`held`: key -> epoch), and how it takes, checks and releases
    them. `prefix` is the instance leases' key prefix (`<channel_prefix>/`); `last_write` a
    statement ($1 key) giving the key's newest row: (instance_name, stream_id), or no row."""

    not_owner: type[NotOwner] = NotOwner
    moving: type[KeyMoving] = KeyMoving
    lost: type[KeyLeaseLost] = KeyLeaseLost

    def __init__(
        self,
        pool: asyncpg.Pool,
        instance_name: str,
        prefix: str,
        positions: WriterPositions,
        notifier: Notifier,
        hears: Callable[[str], bool],
        wait_s: float,
        *,
        table: LeaseTable,
        last_write: str,
        what: str,
    ) -> None:
        self._pool = pool
        self.name = instance_name
        self._prefix = prefix
        self._positions = positions
        self._notifier = notifier
        self.hears = hears
        self._wait_s = wait_s
        self._table = table
        self._last_write = last_write
        #: The write path's checks, built once: (fenced, session) -> statement.
        self._checks = {
            (fenced, session): table.check(fenced=fenced, session=session)
            for fenced in (False, True)
            for session in (False, True)
        }
        #: What the keys are, for messages and logs ("room", "account_data of").
        self.what = what
        self.held: dict[str, int] = {}
        #: Set by `release_all`: this writer stops, it takes no more keys.
        self.closed = False
        self._taking: dict[str, asyncio.Lock] = {}
        self.taken_from_others = 0
        #: Keys taken from another writer: key -> (epoch, (old writer, its last row of the key)).
        self._after: dict[str, tuple[int, tuple[str, int]]] = {}
        #: Called with a key taken from another writer, before the first write there.
        self.on_taken: Callable[[str], None] = lambda _key: None
        #: Old holders fenced by a take (their instance lease had expired).
        self.fenced = 0
        #: The key's writer by the stable hash when only it may take the key (workers of the
        #: previous release run and route by it), else None (`workers.process.previous_release`).
        self.hashed_writer: Callable[[str], str | None] = lambda _key: None

    async def hold(self, key: str) -> None:
        """Return once this writer holds `key` and has seen its last row; raises `not_owner` or
        `moving`."""
        if key in self.held:
            return
        if self.closed:
            raise self.moving(f"{self.name} stops: {self.what} {key} is written elsewhere now")
        hashed = self.hashed_writer(key)
        if hashed not in (None, self.name):
            raise self.moving(f"{self.what} {key} is written by {hashed} while previous-release workers run")
        lock = self._taking.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                if key not in self.held:
                    await self._take(key)
        finally:
            if not lock.locked():
                self._taking.pop(key, None)

    async def _take(self, key: str) -> None:
        table = self._table
        async with self._pool.acquire() as conn:
            epoch = await conn.fetchval(table.take, *table.args(key, self.name, self._prefix))
            if epoch is None:
                holder = await conn.fetchval(table.holder, *table.args(key))
                raise self.not_owner(key, str(holder))
            last = await conn.fetchrow(self._last_write, key)
        if last is not None and last["instance_name"] not in (None, self.name):
            writer, stream_id = last["instance_name"], last["stream_id"]
            await self._taken_from(key, int(epoch), writer, stream_id)
            self.taken_from_others += 1
            log.info("lease taken %s %s from=%s epoch=%d", self.what, key, writer, epoch)
        self.held[key] = int(epoch)

    async def _taken_from(self, key: str, epoch: int, writer: str, stream_id: int) -> None:
        """The take of `key` (under `epoch`) fenced `writer` out of it; its last row there is
        `stream_id`. Make `writer`'s rows up to it final (seen announced, or `writer` fenced), then
        record the hand-over (see the module docstring); raises `moving` when neither."""
        if self._positions.get_current_token_for_writer(writer) < stream_id and not await self._seen(
            writer, stream_id
        ):
            async with self._pool.acquire() as conn:
                if not await fence_expired(conn, self._prefix + writer):
                    raise self.moving(
                        f"{self.what} {key} moves here from {writer}, whose last write is not seen"
                    )
            self.fenced += 1
            log.warning(
                "%s %s taken from %s, unheard and its lease expired: fenced it (it commits nothing"
                " more); readers fetch its rows up to %d before this writer's",
                self.what, key, writer, stream_id,
            )  # fmt: skip
        table = self._table
        async with self._pool.acquire() as conn:
            await conn.execute(table.handovers, *table.args(key, self.name, epoch, writer, stream_id))
        self._after[key] = (epoch, (writer, stream_id))
        self.on_taken(key)

    def after(self, key: str) -> tuple[str, int] | None:
        """What this writer's rows of `key` depend on, under the epoch held: (the writer it was
        taken from, that writer's last row of it), or None."""
        after = self._after.get(key)
        if after is None or self.held.get(key) != after[0]:
            return None
        return after[1]

    @property
    def any_taken(self) -> bool:
        """Whether any key was taken from another writer (else `after` is None for every key)."""
        return bool(self._after)

    def afters(self) -> list[tuple[str, int]]:
        """Every writer a key was taken from, with the highest last row taken over from it: what
        all of this writer's rows may name (a stored row does not always name its key)."""
        highest: dict[str, int] = {}
        for _, (writer, stream_id) in self._after.values():
            highest[writer] = max(stream_id, highest.get(writer, 0))
        return sorted(highest.items())

    async def _seen(self, writer: str, stream_id: int) -> bool:
        return await wait_visible(
            self._positions, writer, stream_id, self._notifier, self.hears, min(self._wait_s, SEEN_WAIT_S)
        )

    async def check(
        self, conn: Conn, keys: Collection[str], fence: Fence | None = None, *, session: bool = False
    ) -> asyncpg.Record:
        """Inside the write's transaction: raise `lost` unless every key is still held under its
        epoch (until the transaction ends, a take of any of them waits); with `fence`, in the same
        statement, `LeaseLost` unless this process still holds its instance name. Its first row:
        with `session`, the transaction's `xid` and backend `pid` (for a lost COMMIT's answer)."""
        lease = (fence.key, fence.idle_ms) if fence is not None else ()
        statement = self._checks[(fence is not None, session)]
        rows = await conn.fetch(statement, *self._table.args(*lease, list(keys), self.name))
        if fence is not None:
            fence.compare(rows[0]["instance_epoch"])
        found = {r["key"]: r["epoch"] for r in rows}
        lost = [key for key in keys if key not in self.held or found.get(key) != self.held[key]]
        if lost:
            for key in lost:
                self.held.pop(key, None)
            raise self.lost(f"the lease of {self.what} {', '.join(sorted(lost))} is no longer held here")
        first: asyncpg.Record = rows[0]
        return first

    async def release_all(self) -> None:
        """Mark every key held under this name released: the next write takes it elsewhere."""
        self.closed = True
        async with self._pool.acquire() as conn:
            status = await conn.execute(self._table.release, *self._table.args(self.name))
        self.held.clear()
        log.info("leases released instance=%s %s=%s", self.name, self.what, status.rpartition(" ")[2])


def holder_of(body: dict[str, Any]) -> str | None:
    """The holder a `NotOwner` answer names (`workers.http.errors`), if any."""
    holder = body.get("holder")
    return holder if isinstance(holder, str) else None
