"""Writes of the user-keyed stored streams (account data, device lists, to-device), from any worker.

Each of these streams has its writers (`stream_writers.<stream>`). A user's writes go to one of
them, chosen by a stable hash of the user id (`workers.routing.writer_for_user`): one user's
changes keep the order they were made in, and the writers share the users.

On the writer, `StreamWriter.write` runs one write:
1. allocate the stream IDs from the stream's generator (shared sequence, `stream_positions`);
2. one transaction: `body(conn, ids)` writes the rows and returns the stream rows `(id, row)` it
   wrote (one per entity that changed: a user, a remote server);
3. `committed(stream, rows)`: the worker applies them to its own caches and stages their RDATA;
4. leave the ID block (the IDs finish, the position is upserted), then `finished(...)`: the
   worker publishes and wakes its own readers (once its position covers the write).
A failed transaction leaves its IDs as harmless gaps. When the answer to COMMIT is lost, the writer
learns the outcome before the IDs finish: the transaction reads its id (`txid_current()`, one
small query: a write's rows may be overwritten later, so they cannot say whether this write
committed), and `workers.storage.commit_outcome` ends the old backend and asks `txid_status`. A
committed write goes on as in 3.; one that did not fails (503 for the client). A committed write
that 3. cannot apply (it reads the database, whose link may have just broken) still answers 200:
readers are made to fetch its IDs from the database instead of its staged rows.

Anywhere else, `UserStreamWrites.run` forwards the operation to the user's writer (a worker
request to `/_fanout/internal/writes/{stream}/{op}`) and waits until this worker's token covers
the write before answering (`workers.handlers.visibility`). Every operation is idempotent (a
retried PUT writes the same value; sendToDevice carries a transaction id), so a forwarded request
may be retried.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import asyncpg

from idgen import MultiWriterIdGenerator
from pubsub.types import Row
from workers.handlers.forwarding import Forwarder, OwnerUnavailable, retried_while_unavailable
from workers.handlers.notifier import Notifier
from workers.handlers.visibility import wait_visible
from workers.routing import writer_for_room, writer_for_user
from workers.storage import Conn
from workers.storage.commit_outcome import CURRENT_XID_SQL, committed, outcome_unknown, xid_committed

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

    async def write(self, count: int, body: WriteBody, users: Sequence[str]) -> StreamPosition:
        """Allocate `count` IDs, run `body` in one transaction, publish its rows; where it landed.

        `users`: whose data the write may change. When the answer to COMMIT was lost, the outcome
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
                        session = await conn.fetchrow(CURRENT_XID_SQL)
                        assert session is not None  # a SELECT without FROM has one row
                        xid, pid = session["xid"], session["pid"]
                        rows = await body(conn, ids)
            except BaseException as e:
                failure = e
                # `rows` set: the body ran, so the failure came at COMMIT (or at the release after it).
                if rows is not None and outcome_unknown(e):
                    if not isinstance(e, Exception):  # cancelled (shutdown): no time to find out
                        woken = await self._unknown(max(ids), users)
                    elif await self._committed_after_all(pid, xid, max(ids), users):
                        failure = None
            if failure is None:
                assert rows is not None
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

    async def _committed_after_all(self, pid: int, xid: int, stream_id: int, users: Sequence[str]) -> bool:
        """The answer to COMMIT was lost: whether the write committed, learned from the database
        before the IDs finish (`commit_outcome.committed`). Interrupted, the outcome stays unknown."""
        try:
            return await committed(self._pool, pid, xid_committed(xid), f"a {self.stream} write")
        except BaseException:
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
    """Runs a user's write of one stream on the writer that owns the user, from any worker.

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
        #: How long an operation keeps trying a writer that cannot take it now (it restarts).
        self.owner_wait_s = 0.0
        #: Whether this worker hears a writer of this stream live (see RoomWrites.hears).
        self.hears: Callable[[str], bool] = lambda _writer: True
        self.forwarded = 0
        self.late_answers = 0

    def owner(self, key: str) -> str:
        return writer_for_user(key, self.writers, self.stream)

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
        owner = self.owner(key)
        if owner == self.name:
            return await self.ops[op](args)
        forwarder = self.forwarder
        if forwarder is None:
            raise OwnerUnavailable(owner, "worker requests are not set up on this worker")
        self.forwarded += 1
        path = f"/_fanout/internal/writes/{quote(self.stream, safe='')}/{quote(op, safe='')}"
        answer = await retried_while_unavailable(
            lambda: forwarder.request(
                owner, f"{self.stream}_{op}", "POST", path, body=args, idempotent=idempotent
            ),
            self.owner_wait_s,
            idempotent=idempotent,
        )
        position = StreamPosition.from_json(answer.get("position"))
        if position is not None and not await wait_visible(
            self.generator, position.instance_name, position.stream_id, self._notifier, self.hears
        ):
            self.late_answers += 1
        return answer

    async def serve(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """A forwarded operation, on the writer. ValueError for an unknown operation or bad
        arguments; OwnerUnavailable when this worker does not own the user."""
        run = self.ops.get(op)
        if run is None:
            raise ValueError(f"the {self.stream} stream has no operation {op!r}")
        key = args.get(self.key_arg)
        if not isinstance(key, str):
            raise ValueError(f"{self.key_arg} is missing")
        if self.owner(key) != self.name:
            raise OwnerUnavailable(self.name, f"{key}'s {self.stream} writer is {self.owner(key)}")
        return await run(args)


class RoomStreamWrites(UserStreamWrites):
    """The same for a stream written per room (receipts): a room's writes go to one writer, chosen
    as a room's events writer is (`writer_for_room` over the stream's writers), so with the same
    writers a room's receipts are written where its events are."""

    key_arg = "room_id"

    def owner(self, key: str) -> str:
        return writer_for_room(key, self.writers)


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
