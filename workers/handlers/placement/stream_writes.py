"""Writes of the user-keyed stored streams (account data, device lists, to-device), from any worker.

Each of these streams has its writers (`stream_writers.<stream>`). A user's writes (a room's, for
receipts) go to one of them at a time, the holder of the (stream, user) lease
(`workers.handlers.placement.leases`, the rooms' mechanism): one user's changes keep the order they were made
in, and the writers share the users. The first write takes the lease on the stable-hash writer
(`workers.routing.writer_for_user`) among the writers not known to be down; a writer's planned stop
releases its users once its writes in flight ended (`UserStreamWrites.drain`), a crashed writer's
users move once its instance lease expired, and the new holder waits until it has seen the user's
last row from the old one before it writes.

On the writer, `StreamWriter.write` runs one write:
1. allocate the stream IDs from the stream's generator (shared sequence, `stream_positions`);
2. one transaction: `body(conn, ids)` writes the rows and returns the stream rows `(id, row)` it
   wrote (one per entity that changed: a user, a remote server); last, the write's key still held
   under its epoch and the instance name still this process's (one statement, `KeyLeases.check`);
3. `committed(stream, rows)`: the worker applies them to its own caches and stages their RDATA
   (rows of a writer that took keys from another name those hand-overs, `after`);
4. leave the ID block (the IDs finish, the position is upserted), then `finished(...)`: the
   worker publishes and wakes its own readers (once its position covers the write).
A failed transaction leaves its IDs as harmless gaps. When the answer to COMMIT is lost, the writer
learns the outcome before the IDs finish: the transaction reads its id (`txid_current()`, in
the statement of 2. that checks the lease: a write's rows may be overwritten later, so they cannot
say whether this write committed), and `workers.storage.commit_outcome` ends the old backend
and asks `txid_status`. A committed write goes on as in 3.; one that did not fails (503 for the
client). A committed write that 3. cannot apply (it reads the database, whose link may have just
broken) still answers 200: readers are made to fetch its IDs from the database instead of its
staged rows.

Anywhere else, `UserStreamWrites.run` forwards the operation to the user's writer (a worker
request to `/_fanout/internal/writes/{stream}/{op}`), following a writer that names another holder
and waiting out a move (`workers.handlers.placement.routed`), and waits until this worker's token covers
the write before answering (`workers.handlers.notify.visibility`). Every operation but a key claim is
idempotent (a retried PUT writes the same value; sendToDevice carries a transaction id), so a
forwarded request may be retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import asyncpg

from idgen import MultiWriterIdGenerator
from pubsub.types import Row
from workers.errors import PersisterStopped
from workers.handlers.notify.notifier import Notifier
from workers.handlers.notify.visibility import wait_visible
from workers.handlers.placement.forwarding import Forwarder, OwnerUnavailable
from workers.handlers.placement.leases import KeyLeaseLost, KeyLeases
from workers.handlers.placement.routed import OwnerWaits, routed
from workers.process.instance_lease import Fence, LeaseLost
from workers.routing import RoomPlacement, writer_for_room, writer_for_user
from workers.storage import Conn
from workers.storage.commit_outcome import CURRENT_XID_SQL, committed, outcome_unknown, xid_committed
from workers.streams.handovers import with_afters

log = logging.getLogger(__name__)

#: (stream, [(stream id, row)]): the worker's hook after commit, before the IDs finish; it returns
#: the (rooms, users) to wake.
Committed = Callable[[str, Sequence[tuple[int, Row]]], Awaitable[tuple[set[str], set[str]]]]
#: (stream, highest id, (rooms, users)): the worker's hook once the IDs finished (publish, wake).
Finished = Callable[[str, int, tuple[set[str], set[str]]], None]
#: (stream, highest id, users): a write whose outcome stays unknown (its COMMIT's answer was lost and
#: the writer was stopped before it could find out), before its IDs finish: the worker treats those
#: users as changed and has readers fetch the id's rows from the database, not knowing.
Uncertain = Callable[[str, int, Sequence[str]], Awaitable[tuple[set[str], set[str]]]]
#: Writes a write's rows on `conn` (inside its transaction) with the allocated `ids`.
WriteBody = Callable[[Conn, list[int]], Awaitable[list[tuple[int, Row]]]]
#: An operation on the writer: the request's JSON arguments -> the JSON answer.
Operation = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class StreamPosition:
    """Where a write landed: its writer and its (highest) stream id."""

    instance_name: str
    stream_id: int

    def to_json(self) -> dict[str, Any]:
        return {"instance_name": self.instance_name, "stream_id": self.stream_id}

    @classmethod
    def from_json(cls, value: Any) -> StreamPosition | None:
        if not isinstance(value, dict):
            return None
        instance, stream_id = value.get("instance_name"), value.get("stream_id")
        if not isinstance(instance, str) or not isinstance(stream_id, int) or isinstance(stream_id, bool):
            return None
        return cls(instance, stream_id)


class StreamWriter:
    """One stored stream's writes on one of its writers (see the module docstring for the order)."""

    def __init__(
        self,
        stream: str,
        instance_name: str,
        generator: MultiWriterIdGenerator,
        pool: asyncpg.Pool,
        committed: Committed,
        finished: Finished,
        uncertain: Uncertain,
    ) -> None:
        self.stream = stream
        self.name = instance_name
        self._generator = generator
        self._pool = pool
        self._committed = committed
        self._finished = finished
        self._uncertain = uncertain
        self.writes = 0
        #: The leases of the keys written here and the instance name's, both checked inside each
        #: write's transaction (None: not checked).
        self.leases: KeyLeases | None = None
        self.fence: Fence | None = None
        #: Writes whose COMMIT's outcome stayed unknown: their keys move only at lease expiry.
        self.unknown_outcomes = 0

    async def write(
        self, count: int, body: WriteBody, users: Sequence[str], key: str | None = None
    ) -> StreamPosition:
        """Allocate `count` IDs, run `body` in one transaction, publish its rows; where it landed.

        `key`: the lease the write needs (the user or room it was routed by); `users`: whose data
        the write may change. When the answer to COMMIT was lost, the outcome
        is learned before returning (committed: as though nothing failed; not: the error is
        raised). Stopped before it is known, this worker treats them as changed, and readers are
        made to fetch the write's ids from the database (a needless query at worst)."""
        failure: BaseException | None = None
        woken: tuple[set[str], set[str]] = (set(), set())
        async with self._generator.get_next_mult(count) as ids:
            pid = xid = 0
            rows: list[tuple[int, Row]] | None = None
            try:
                async with self._pool.acquire() as conn:
                    async with conn.transaction():
                        written_rows = await body(conn, ids)
                        xid, pid = await self._check(conn, key)
                        rows = written_rows
            except BaseException as e:
                failure = e
                if isinstance(e, (KeyLeaseLost, LeaseLost)):
                    log.warning("a %s write did not commit: %s", self.stream, e)
                # `rows` set: the body ran, so the failure came at COMMIT (or at the release after it).
                if rows is not None and outcome_unknown(e):
                    if not isinstance(e, Exception):  # cancelled (shutdown): no time to find out
                        self.unknown_outcomes += 1
                        woken = await self._unknown(max(ids), users)
                    elif await self._committed_after_all(pid, xid, max(ids), users):
                        failure = None
            if failure is None:
                assert rows is not None
                if self.leases is not None and self.leases.any_taken:  # rows name the keys' hand-overs
                    rows = with_afters(rows, self.leases.afters())
                try:
                    woken = await self._committed(self.stream, rows)
                except Exception as e:  # committed, but not applied here (say, its database link broke)
                    log.warning(
                        "a committed %s write could not be applied here (%s: %s); readers read it from"
                        " the database", self.stream, type(e).__name__, e,
                    )  # fmt: skip
                    woken = await self._unknown(max(ids), users)
        self._finished(self.stream, max(ids), woken)
        if failure is not None:
            raise failure
        self.writes += 1
        return StreamPosition(self.name, max(ids))

    async def _check(self, conn: Conn, key: str | None) -> tuple[int, int]:
        """The write's last statement before COMMIT (the lease rows are held only until then): its
        key's lease and the instance name still held, and the transaction's (xid, backend pid)."""
        session: asyncpg.Record | None
        if self.leases is not None and key is not None:
            session = await self.leases.check(conn, [key], self.fence, session=True)
        else:
            if self.fence is not None:
                await self.fence.check(conn)
            session = await conn.fetchrow(CURRENT_XID_SQL)
        assert session is not None  # a SELECT without FROM (or from a LEFT JOIN on it) has a row
        return session["xid"], session["pid"]

    async def _committed_after_all(self, pid: int, xid: int, stream_id: int, users: Sequence[str]) -> bool:
        """The answer to COMMIT was lost: whether the write committed, learned from the database
        before the IDs finish (`commit_outcome.committed`). Interrupted, the outcome stays unknown."""
        try:
            return await committed(self._pool, pid, xid_committed(xid), f"a {self.stream} write")
        except BaseException:
            self.unknown_outcomes += 1
            await self._unknown(stream_id, users)
            raise

    async def _unknown(self, stream_id: int, users: Sequence[str]) -> tuple[set[str], set[str]]:
        """The write's rows may be in the database and are not staged here (its COMMIT's outcome is
        unknown, or it committed but could not be applied here): readers fetch `stream_id` from the
        database, its users count as changed here. Its IDs must not have finished yet."""
        with contextlib.suppress(Exception):
            return await self._uncertain(self.stream, stream_id, users)
        return set(), set()


class UserStreamWrites:
    """Runs a user's write of one stream on the writer that holds the user, from any worker.

    `ops` are the operations the writer runs (registered by the stream's handler); each answers a
    JSON object, with `"position"` (`StreamPosition.to_json`) when it wrote something. Every
    operation's arguments hold the key its writer is chosen by (`key_arg`)."""

    key_arg = "user_id"

    def __init__(
        self,
        stream: str,
        instance_name: str,
        writers: Sequence[str],
        generator: MultiWriterIdGenerator,
        writer: StreamWriter | None,
        notifier: Notifier,
    ) -> None:
        self.stream = stream
        self.name = instance_name
        self.writers = list(writers)
        self.generator = generator
        self.writer = writer
        self._notifier = notifier
        self.ops: dict[str, Operation] = {}
        self.forwarder: Forwarder | None = None
        #: Where each key's writes go now: its holder as last learned, else the stable choice.
        self.placement = RoomPlacement(self.writers, time.monotonic, choose=self.hashed)
        #: The keys this worker holds, on a writer of the stream (None: not leased).
        self.leases: KeyLeases | None = None
        #: How long an operation keeps trying a writer that cannot take it now (it restarts).
        self.owner_wait_s = 0.0
        #: Whether this worker hears a writer of this stream live (see RoomWrites.hears).
        self.hears: Callable[[str], bool] = lambda _writer: True
        self.forwarded = 0
        self.late_answers = 0
        #: Operations that had to wait for their writer, and the longest such wait.
        self.owner_waits = OwnerWaits()
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def hashed(self, key: str, writers: Sequence[str]) -> str:
        """The stable choice among `writers` for `key`: where its lease is first taken."""
        return writer_for_user(key, writers, self.stream)

    def owner(self, key: str) -> str:
        """Where `key`'s writes go now (`RoomPlacement`)."""
        return self.placement.owner(key)

    def here(self) -> StreamWriter:
        """The writer, on a worker that writes this stream (OwnerUnavailable elsewhere)."""
        if self.writer is None:
            raise OwnerUnavailable(self.name, f"this worker does not write the {self.stream} stream")
        return self.writer

    async def run(
        self, key: str, op: str, args: dict[str, Any], *, idempotent: bool = True
    ) -> dict[str, Any]:
        """Run `op` for `key` (a user id; a room id for `RoomStreamWrites`) on its writer. Raises
        OwnerUnavailable, ForwardRefused, or what the operation raises when it runs here
        (ValueError for bad arguments). While the writer cannot be reached (it restarts), an
        `idempotent` operation is tried again for up to `owner_wait_s`; one that is not only while
        the writer certainly did not act on it (never sent twice)."""
        if not self.writers:
            raise OwnerUnavailable(f"{self.stream} writer", f"stream_writers.{self.stream} is empty", 30)

        return await routed(
            self.placement, key, self.name, lambda: self.run_here(key, op, args),
            lambda owner: self._forward(owner, op, args, idempotent),
            retry=idempotent, within_s=self.owner_wait_s, waits=self.owner_waits,
        )  # fmt: skip

    async def _forward(self, owner: str, op: str, args: dict[str, Any], idempotent: bool) -> dict[str, Any]:
        if self.forwarder is None:
            raise OwnerUnavailable(owner, "worker requests are not set up on this worker")
        self.forwarded += 1
        path = f"/_fanout/internal/writes/{quote(self.stream, safe='')}/{quote(op, safe='')}"
        answer = await self.forwarder.request(
            owner, f"{self.stream}_{op}", "POST", path, body=args, idempotent=idempotent
        )
        position = StreamPosition.from_json(answer.get("position"))
        if position is not None and not await wait_visible(
            self.generator, position.instance_name, position.stream_id, self._notifier, self.hears
        ):
            self.late_answers += 1
        return answer

    async def serve(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """A forwarded operation, on the writer. ValueError for an unknown operation or bad
        arguments; what `run_here` raises."""
        if op not in self.ops:
            raise ValueError(f"the {self.stream} stream has no operation {op!r}")
        key = args.get(self.key_arg)
        if not isinstance(key, str):
            raise ValueError(f"{self.key_arg} is missing")
        return await self.run_here(key, op, args)

    async def run_here(self, key: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run `op` on this writer once it holds `key`'s lease: `NotOwner` naming the holder,
        `KeyMoving` while the key moves here, `PersisterStopped` once this writer stops (`drain`).
        Without leases, only the key's stable choice runs it (OwnerUnavailable elsewhere)."""
        leases = self.leases
        if leases is None:
            owner = self.hashed(key, self.writers)
            if owner != self.name:
                raise OwnerUnavailable(self.name, f"{key}'s {self.stream} writer is {owner}")
            return await self.ops[op](args)
        if leases.closed:
            raise PersisterStopped(f"{self.name} stops: its {self.stream} writes go to the other writers")
        self._running += 1
        self._idle.clear()
        try:
            await leases.hold(key)
            return await self.ops[op](args)
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()

    async def drain(self, within_s: float) -> bool:
        """A planned stop: take no more operations, wait (up to `within_s`) for those running here,
        then release every key held here unless a write's outcome stayed unknown (those keys move
        when the instance lease expires). Whether the keys were released."""
        leases = self.leases
        if leases is None:
            return False
        leases.closed = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), within_s)
        if self._running or (self.writer is not None and self.writer.unknown_outcomes):
            log.warning(
                "%s: %d operations running, %d of unknown outcome: its keys move when the instance"
                " lease expires", self.stream, self._running,
                self.writer.unknown_outcomes if self.writer is not None else 0,
            )  # fmt: skip
            return False
        await leases.release_all()
        return True


class RoomStreamWrites(UserStreamWrites):
    """The same for a stream written per room (receipts): a room's writes go to one writer, the
    holder of the room's receipts lease, first taken where a room's events lease is
    (`writer_for_room` over the stream's writers)."""

    key_arg = "room_id"

    def hashed(self, key: str, writers: Sequence[str]) -> str:
        return writer_for_room(key, writers)


def text_arg(args: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    """A forwarded operation's string argument (None allowed when `optional`); ValueError if not."""
    return _arg(args, key, str, "a string", optional)


def object_arg(args: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    """A forwarded operation's JSON object argument (None allowed when `optional`); ValueError if not."""
    return _arg(args, key, dict, "an object", optional)


def _arg(args: dict[str, Any], key: str, kind: type, what: str, optional: bool) -> Any:
    value = args.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind):
        raise ValueError(f"{key} must be {what}")
    return value


def written(position: StreamPosition) -> dict[str, Any]:
    """The answer of an operation that wrote at `position`."""
    return {"position": position.to_json()}
