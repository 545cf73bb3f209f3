"""One-time and fallback keys: uploads on the user's device_lists writer, claims on any worker.

An upload runs on the writer that records the user's device-key changes (`UserStreamWrites` of
the device_lists stream, as device keys do), in one transaction: one user's uploads are applied
one at a time, so "this key id is already stored with other content" is decided against what the
device holds. It writes no stream row: a key count is not a device-list change.

A claim runs on a device_lists writer too (the first claimed user's, one forwarded operation per
writer): one PostgreSQL statement picks and deletes each key
(`workers.storage.one_time_keys.claim_keys`), so claims racing on any writers never share a key.

Counts are read where they are exact: `/keys/upload` and every /sync answer read them from
PostgreSQL (`CountReads`: the reads of one event-loop turn in one statement, so a wake of many
readers costs one query), never from a cache. A claim answered 200 on one worker is committed, so
the key owner's next answer on any worker tells the count after it (read-your-writes across
workers and users, which a cache invalidated by replication cannot give: its row may still be on
its way). Uploads and claims still write a caches-stream row naming the devices whose counts they
changed (`count_e2e_one_time_keys`), in their own transaction, for the workers of the previous
release, which cache the counts.

While workers of the previous release run (`workers.process.previous_release`), whose writers know no
`claim_keys`: a claim such a writer refuses runs here as theirs do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from workers.handlers.caches.lru import CacheRows
from workers.handlers.placement.forwarding import ForwardRefused, OwnerUnavailable
from workers.handlers.placement.stream_writes import UserStreamWrites, object_arg, text_arg
from workers.model import KEYS_PER_INVALIDATION
from workers.storage import Conn
from workers.storage import one_time_keys as store
from workers.storage.one_time_keys import ClaimedKey, KeyConflict, UploadedKey

#: Longest algorithm name or key id taken (both are short identifiers in every known algorithm).
MAX_NAME = 255
#: How long a count read asked for ahead waits to be taken (its answer is usually made within a
#: few milliseconds: the line that asked for it applies, and the polls wake).
AHEAD_KEEP_NS = 2_000_000_000
#: The caches-stream name of a device's key counts (Synapse's); its keys are `counts_key`s.
KEY_COUNTS_CACHE = "count_e2e_one_time_keys"


def counts_key(user_id: str, device_id: str) -> str:
    """A device's key in the counts cache: a user id holds no newline, so the pair is one string."""
    return f"{user_id}\n{device_id}"


class KeyUploadRefused(Exception):
    """The writer refused an upload: no such device (`M_INVALID_PARAM`), or a key id held with
    other content (`M_UNKNOWN`, as Synapse answers it)."""

    def __init__(self, errcode: str, message: str) -> None:
        super().__init__(message)
        self.errcode = errcode


@dataclass(frozen=True, slots=True)
class KeyCounts:
    """What a device is told of its keys: one-time keys left per algorithm, unused fallback kinds."""

    one_time: dict[str, int]
    unused_fallback: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"one_time_key_counts": self.one_time, "unused_fallback_key_types": self.unused_fallback}


def parse_keys(value: Any, field: str) -> list[UploadedKey]:
    """The keys of an upload's `one_time_keys` or `fallback_keys` (`{"algorithm:key_id": key}`,
    a key an object or a string); ValueError saying what is wrong."""
    if value is None:
        return []
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be an object of algorithm:key_id -> key")
    keys: list[UploadedKey] = []
    for name, key in value.items():
        algorithm, _, key_id = name.partition(":")
        if not algorithm or not key_id or len(name) > MAX_NAME or not name.isprintable():
            raise ValueError(f"{field}: {name[:80]!r} is not algorithm:key_id")
        if not isinstance(key, dict | str):
            raise ValueError(f"{field}[{name!r}] must be an object or a string")
        keys.append(UploadedKey(algorithm, key_id, json.dumps(key, sort_keys=True, separators=(",", ":"))))
    return keys


def claimed_json(claimed: Sequence[ClaimedKey]) -> dict[str, dict[str, dict[str, Any]]]:
    """user -> device -> {"algorithm:key_id": key}, as `/keys/claim` answers."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for c in claimed:
        out.setdefault(c.user_id, {})[c.device_id] = {c.key.name: json.loads(c.key.key_json)}
    return out


def _claim_answer(claimed: Sequence[ClaimedKey]) -> dict[str, Any]:
    """A writer's answer to `claim_keys` (`OneTimeKeys.claim` reads it)."""
    rows = [[c.user_id, c.device_id, c.key.algorithm, c.key.key_id, c.key.key_json] for c in claimed]
    return {"claimed": rows}


async def read_counts(conn: Conn, user_id: str, device_id: str) -> KeyCounts:
    return KeyCounts(*await store.key_counts(conn, user_id, device_id))


Device = tuple[str, str]
T = TypeVar("T")


class CountReads:
    """Exact key counts, read from PostgreSQL: every read asked for in one event-loop turn shares
    one statement (`store.key_counts_of`), so the many answers of one wake cost one query.

    A read never joins a statement already sent: that one may have started before the change the
    asker has been told of (a claim answered 200 to another client) committed. The exception is a
    read asked for ahead (`ahead`: a line for a room the device's long-poll waits on arrived, so
    its answer will want the counts): an asker whose request started before that read was asked
    for (`read`'s `since_ns`) takes it, since the read then began after anything the asker had been
    told of, and the answer does not wait for a statement of its own after the wake.

    `ride` asks for reads ahead as `ahead` does, and hands the turn's reads to a statement the
    caller makes anyway (the line's event bodies: `CountTurn`), so that the wake's answers wait
    for one reply, not two."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._waiting: dict[Device, asyncio.Future[KeyCounts]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: device -> (time.monotonic_ns() when it was asked for, the read) of reads asked for ahead,
        #: oldest first; each is taken once, or dropped after `AHEAD_KEEP_NS`.
        self._ahead: dict[Device, tuple[int, asyncio.Future[KeyCounts]]] = {}
        #: Statements sent, statements of another read that carried this turn's reads (`ride`),
        #: and reads asked for ahead that an answer took.
        self.statements = self.rode = self.taken_ahead = 0

    def ahead(self, devices: Iterable[Device]) -> None:
        """Read these devices' counts in this turn's statement, for answers about to be made."""
        now = time.monotonic_ns()
        kept = self._ahead
        while kept:
            oldest = next(iter(kept))
            if kept[oldest][0] >= now - AHEAD_KEEP_NS:
                break
            del kept[oldest]
        for device in devices:
            kept.pop(device, None)
            kept[device] = (now, self.read(*device))

    def ride(self, devices: Iterable[Device]) -> CountTurn | None:
        """`ahead`, with this turn's reads (those and any asked for since the last statement) taken
        out for the caller's own statement (`CountTurn.riding`, or `CountTurn.send` when it makes
        none). None when there is nothing to read."""
        self.ahead(devices)
        waiting, self._waiting = self._waiting, {}
        return CountTurn(self, waiting) if waiting else None

    def read(self, user_id: str, device_id: str, since_ns: int = 0) -> asyncio.Future[KeyCounts]:
        """The device's counts as committed after this call, or after `since_ns` (the
        time.monotonic_ns() at which the asker's request started) when a read asked for ahead
        since then has them."""
        device = (user_id, device_id)
        if since_ns and (early := self._ahead.pop(device, None)) is not None and early[0] > since_ns:
            self.taken_ahead += 1
            return early[1]
        future = self._waiting.get(device)
        if future is None:
            if not self._waiting:
                asyncio.get_running_loop().call_soon(self._send)
            future = self._waiting[device] = asyncio.get_running_loop().create_future()
        return future

    def _send(self) -> None:
        waiting, self._waiting = self._waiting, {}
        if waiting:  # else `ride` took them
            self._start(waiting)

    def _start(self, waiting: dict[Device, asyncio.Future[KeyCounts]]) -> None:
        self.statements += 1
        task = asyncio.create_task(self._fetch(waiting), name="key-counts")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch(self, waiting: dict[Device, asyncio.Future[KeyCounts]]) -> None:
        async def read(devices: list[Device]) -> tuple[None, store.KeyCountsOf]:
            async with self._pool.acquire() as conn:
                return None, await store.key_counts_of(conn, devices)

        with contextlib.suppress(Exception):  # each asker has it
            await _answer(waiting, read)


async def _answer(
    waiting: dict[Device, asyncio.Future[KeyCounts]],
    read: Callable[[list[Device]], Awaitable[tuple[T, store.KeyCountsOf]]],
    *,
    cancel: bool = True,
) -> T:
    """Run `read` for the devices of `waiting` and give each asker its counts, or the error (a 503
    where the database is away; cancelled when the read is, if `cancel`); `read`'s other result."""
    try:
        result, counts = await read(list(waiting))
    except Exception as e:
        for future in waiting.values():
            if not future.done():
                future.set_exception(e)
                future.exception()  # retrieved: an asker that went away must not log it
        raise
    except BaseException:
        if cancel:
            for future in waiting.values():
                future.cancel()
        raise
    for device, future in waiting.items():
        if not future.done():
            future.set_result(KeyCounts(*counts[device]))
    return result


class CountTurn:
    """A turn's key-count reads, taken out of `CountReads` (`ride`) to go in another statement:
    `riding` makes that statement with them (`read` gets the devices and returns its own result
    with their counts); `send` sends them in a statement of their own instead. Exactly one of the
    two, once. A carrying statement that is cancelled hands the reads back to a statement of
    their own: the askers were not cancelled, only the line that carried them."""

    __slots__ = ("_reads", "_waiting")

    def __init__(self, reads: CountReads, waiting: dict[Device, asyncio.Future[KeyCounts]]) -> None:
        self._reads = reads
        self._waiting = waiting

    async def riding(self, read: Callable[[list[Device]], Awaitable[tuple[T, store.KeyCountsOf]]]) -> T:
        self._reads.rode += 1
        try:
            return await _answer(self._waiting, read, cancel=False)
        except asyncio.CancelledError:
            self.send()
            raise

    def send(self) -> None:
        self._reads._start(self._waiting)


class OneTimeKeys:
    def __init__(self, writes: UserStreamWrites, pool: asyncpg.Pool) -> None:
        self.writes = writes
        self._pool = pool
        writes.ops["upload_keys"] = self._upload
        writes.ops["claim_keys"] = self._claim
        self._reads = CountReads(pool)
        #: Set on a device_lists writer: the caches-stream rows its uploads and claims write.
        self.cache_rows: CacheRows | None = None
        #: True while workers of the previous release run: claims their writers refuse run here.
        self.mixed_release: Callable[[], bool] = lambda: False

    async def upload(self, user_id: str, device_id: str, one_time_keys: Any, fallback_keys: Any) -> KeyCounts:
        """Store the device's one-time and fallback keys (checked with `parse_keys` first);
        the counts after. Raises ValueError, KeyUploadRefused, OwnerUnavailable."""
        parse_keys(one_time_keys, "one_time_keys")
        parse_keys(fallback_keys, "fallback_keys")
        answer = await self.writes.run(
            user_id,
            "upload_keys",
            {
                "user_id": user_id, "device_id": device_id,
                "one_time_keys": one_time_keys or {}, "fallback_keys": fallback_keys or {},
            },
        )  # fmt: skip
        error = answer.get("error")
        if isinstance(error, str):
            errcode = answer.get("errcode")
            raise KeyUploadRefused(errcode if isinstance(errcode, str) else "M_UNKNOWN", error)
        counts, fallback = answer.get("one_time_key_counts"), answer.get("unused_fallback_key_types")
        if not isinstance(counts, dict) or not isinstance(fallback, list):
            raise ValueError("the device_lists writer answered without key counts")
        return KeyCounts(counts, fallback)

    def counts(self, user_id: str, device_id: str, since_ns: int = 0) -> asyncio.Future[KeyCounts]:
        """The device's counts as committed now, or after `since_ns` (`CountReads.read`)."""
        return self._reads.read(user_id, device_id, since_ns)

    def counts_ahead(self, devices: Iterable[tuple[str, str]]) -> CountTurn | None:
        """Start reading these devices' counts for answers about to be made, in a statement the
        caller makes (`CountReads.ride`)."""
        return self._reads.ride(devices)

    async def claim(self, wanted: Sequence[tuple[str, str, str]]) -> list[ClaimedKey]:
        """One key per (user, device, algorithm) that has one (see `store.claim_keys`), claimed on
        the device_lists writers (one operation per writer, at once). Raises OwnerUnavailable."""
        if not wanted:
            return []
        by_writer: dict[str, list[list[str]]] = {}
        for user_id, device_id, algorithm in wanted:
            by_writer.setdefault(self.writes.owner(user_id), []).append([user_id, device_id, algorithm])
        answers = await asyncio.gather(*(self._claim_on_writer(group) for group in by_writer.values()))
        claimed: list[ClaimedKey] = []
        for answer in answers:
            rows = answer.get("claimed")
            if not isinstance(rows, list):
                raise ValueError("the device_lists writer answered a claim without keys")
            claimed += [ClaimedKey(u, d, UploadedKey(a, i, j)) for u, d, a, i, j in rows]
        return claimed

    async def _claim_on_writer(self, group: list[list[str]]) -> dict[str, Any]:
        try:
            # Never sent twice: a claim that committed and was sent again would use up a key.
            return await self.writes.run(
                group[0][0], "claim_keys", {"user_id": group[0][0], "wanted": group}, idempotent=False
            )
        except ForwardRefused as e:
            if not (self.mixed_release() and "no operation 'claim_keys'" in str(e.body.get("error"))):
                raise
        # A writer of the previous release: claim here, as it does.
        async with self._pool.acquire() as conn:
            claimed = await store.claim_keys(conn, [(u, d, a) for u, d, a in group])
        return _claim_answer(claimed)

    # -- on the writer ---------------------------------------------------------------------------

    async def _upload(self, args: dict[str, Any]) -> dict[str, Any]:
        user_id, device_id = text_arg(args, "user_id"), text_arg(args, "device_id")
        one_time = parse_keys(object_arg(args, "one_time_keys"), "one_time_keys")
        fallback = parse_keys(object_arg(args, "fallback_keys"), "fallback_keys")
        try:
            async with self._rows().reserve() as pending, self._pool.acquire() as conn:
                async with conn.transaction():
                    await store.add_one_time_keys(conn, user_id, device_id, one_time, int(time.time() * 1000))
                    await store.set_fallback_keys(conn, user_id, device_id, fallback)
                    await pending.write(conn, KEY_COUNTS_CACHE, [counts_key(user_id, device_id)])
                counts = await read_counts(conn, user_id, device_id)
        except KeyConflict as e:  # an answer, not a failure of the request: no retries
            return {"errcode": "M_UNKNOWN", "error": str(e)}
        except asyncpg.ForeignKeyViolationError:
            return {"errcode": "M_INVALID_PARAM", "error": f"{user_id} has no device {device_id}"}
        return counts.to_json()

    async def _claim(self, args: dict[str, Any]) -> dict[str, Any]:
        wanted = args.get("wanted")
        if not isinstance(wanted, list) or not all(
            isinstance(w, list) and len(w) == 3 and all(isinstance(p, str) for p in w) for w in wanted
        ):
            raise ValueError("wanted must be a list of [user_id, device_id, algorithm]")
        async with self._rows().reserve() as pending, self._pool.acquire() as conn:
            async with conn.transaction():
                claimed = await store.claim_keys(conn, [(u, d, a) for u, d, a in wanted])
                changed = sorted({counts_key(c.user_id, c.device_id) for c in claimed})
                if changed:  # more devices than one row names: the whole cache
                    keys = changed if len(changed) <= KEYS_PER_INVALIDATION else None
                    await pending.write(conn, KEY_COUNTS_CACHE, keys)
        return _claim_answer(claimed)

    def _rows(self) -> CacheRows:
        if self.cache_rows is None:
            raise OwnerUnavailable(self.writes.name, "this device_lists writer writes no caches stream")
        return self.cache_rows
