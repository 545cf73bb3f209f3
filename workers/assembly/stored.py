"""The stored streams of a worker (account data, device lists, to-device, receipts), wired by `app.py`:

    self.stored = await StoredStreams.load(pool, config, name, writers)   # with the ID generators
    streams += self.stored.streams()                                       # replicated like events
    self.stored.bind(replication, caches, notifier, hears)                 # once those exist
    self.stored.set_forwarder(requests)                                    # with the HTTP side

Each stream has one ID generator over its tables, its writers (`stream_writers.<stream>`, the
events writers when unset), a `UserStreamWrites` that runs a user's writes on the user's writer
(receipts: a `RoomStreamWrites`, a room's on the room's writer), and a `StreamChangeCache` that
/sync asks before it queries (keyed by user; by room for receipts). On a writer, the user's (room's)
lease (`workers.handlers.placement.leases`, `stream_leases`) says it is the one: `follow` gives the writes the
instance lease to check with it, `drain` hands the keys on at a planned stop.

Rows, local or replicated, go through `apply` before the stream's position advances: it records
the change in the stream's change cache and says whom to wake (the user of an account-data or
to-device row; everyone sharing a room with the user of a device-list row; the room of a receipt,
or only its owner for a private one). A writer's own rows
take the same path after commit (`committed`), are staged for RDATA there, and wake its readers
once the IDs finished (`finished`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from idgen import MultiWriterIdGenerator, SequenceReads
from idgen.multi_writer import DATABASE_ERRORS
from pubsub.client import ReplicationClient
from pubsub.streams import Stream
from pubsub.types import Row
from workers.config import WorkerConfig
from workers.handlers.caches.change_cache import StreamChangeCache
from workers.handlers.caches.lru import SyncCaches
from workers.handlers.notify.notifier import DeferredWakes, Notifier
from workers.handlers.placement.forwarding import Forwarder
from workers.handlers.placement.leases import KeyLeases, stream_table
from workers.handlers.placement.stream_writes import RoomStreamWrites, StreamWriter, UserStreamWrites
from workers.handlers.stored.account_data import AccountData
from workers.handlers.stored.device_lists import DeviceLists, RemoteDevices
from workers.handlers.stored.one_time_keys import OneTimeKeys
from workers.handlers.stored.receipts import Receipts, woken_by
from workers.handlers.stored.to_device import ToDeviceInbox
from workers.handlers.sync.stored_sections import StoredSections
from workers.process.instance_lease import Fence
from workers.storage import account_data as account_data_store
from workers.storage import device_lists as device_lists_store
from workers.storage import receipts as receipts_store
from workers.storage import to_device as to_device_store
from workers.streams import account_data, device_lists, receipts, to_device

log = logging.getLogger(__name__)

_Factory = Callable[[asyncpg.Pool, MultiWriterIdGenerator, Sequence[str]], Stream[Any]]
#: name -> (tables, sequence, stream factory) of each stored stream.
_STREAMS: dict[str, tuple[list[tuple[str, str, str]], str, _Factory]] = {
    account_data.ACCOUNT_DATA: (account_data.TABLES, account_data.SEQUENCE, account_data.account_data_stream),
    device_lists.DEVICE_LISTS: (device_lists.TABLES, device_lists.SEQUENCE, device_lists.device_lists_stream),
    to_device.TO_DEVICE: (to_device.TABLES, to_device.SEQUENCE, to_device.to_device_stream),
    receipts.RECEIPTS: (receipts.TABLES, receipts.SEQUENCE, receipts.receipts_stream),
}
#: The statement giving a key's newest row of each stream (`KeyLeases`, `last_write`).
_LAST_WRITE = {
    account_data.ACCOUNT_DATA: account_data_store.LAST_WRITE,
    device_lists.DEVICE_LISTS: device_lists_store.LAST_WRITE,
    to_device.TO_DEVICE: to_device_store.LAST_WRITE,
    receipts.RECEIPTS: receipts_store.LAST_WRITE,
}


class StoredStreams:
    """The stored user streams of one worker; create with `await StoredStreams.load(...)`."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        config: WorkerConfig,
        writers: Callable[[str], list[str]],
        fetch_remote: RemoteDevices,
        generators: dict[str, MultiWriterIdGenerator],
    ) -> None:
        self.name = config.instance_name
        self._pool = pool
        self._writers = writers
        self._fetch_remote = fetch_remote
        self._server_name = config.server_name
        self._lease_prefix = f"{config.channel_prefix}/"
        self._writer_wait_s = config.writer_wait_s
        self.generators = generators
        self.changes: dict[str, StreamChangeCache] = {}
        for stream, generator in generators.items():
            # Rows at or below every position known now were written before this process.
            self.changes[stream] = StreamChangeCache(
                f"{stream}_changes", _highest(generator), config.cache_max_entries * 10,
                by_writer=stream == device_lists.DEVICE_LISTS,  # a sync's device-list changes from memory
            )  # fmt: skip
        self.writes: dict[str, UserStreamWrites] = {}

    @classmethod
    async def load(
        cls,
        pool: asyncpg.Pool,
        config: WorkerConfig,
        writers: Callable[[str], list[str]],
        fetch_remote: RemoteDevices,
        reads: SequenceReads | None = None,
    ) -> StoredStreams:
        """Load the streams' ID generators (their sequence reads shared through `reads`); the
        rest comes with `bind`."""
        generators = {
            stream: await MultiWriterIdGenerator.create(
                pool,
                stream_name=stream,
                instance_name=config.instance_name,
                tables=tables,
                sequence_name=sequence,
                writers=writers(stream),
                sequence_reads=reads,
            )
            for stream, (tables, sequence, _factory) in _STREAMS.items()
        }
        return cls(pool, config, writers, fetch_remote, generators)

    def streams(self) -> list[Stream[Any]]:
        return [
            factory(self._pool, self.generators[stream], self._writers(stream))
            for stream, (_tables, _sequence, factory) in _STREAMS.items()
        ]

    def bind(
        self,
        replication: ReplicationClient,
        caches: SyncCaches,
        notifier: Notifier,
        hears: Callable[[str, str], bool],
    ) -> None:
        """Build the writes and handlers once the worker's replication and caches exist;
        `hears(stream, writer)`: this worker hears the writer live."""
        self._replication = replication
        self._caches = caches
        self._notifier = notifier
        self._wakes = {s: DeferredWakes(notifier, self._own_position(s)) for s in _STREAMS}
        replication.add_foreign_writer_listener(self._foreign_writer)
        for stream in _STREAMS:
            writers = self._writers(stream)
            writer = None
            if self.name in writers:
                writer = StreamWriter(
                    stream, self.name, self.generators[stream], self._pool, self.committed, self.finished,
                    self.uncertain,
                )  # fmt: skip
            kind = RoomStreamWrites if stream == receipts.RECEIPTS else UserStreamWrites
            writes = kind(stream, self.name, writers, self.generators[stream], writer, notifier)
            writes.hears = lambda instance, s=stream: hears(s, instance)  # type: ignore[misc]
            if writer is not None:
                writes.leases = writer.leases = KeyLeases(
                    self._pool, self.name, self._lease_prefix, self.generators[stream], notifier,
                    writes.hears, self._writer_wait_s,
                    table=stream_table(stream), last_write=_LAST_WRITE[stream], what=stream,
                )  # fmt: skip
            self.writes[stream] = writes
        self.account_data = AccountData(self.writes[account_data.ACCOUNT_DATA], self._pool)
        self.device_lists = DeviceLists(
            self.writes[device_lists.DEVICE_LISTS], self._pool, self._server_name, self._fetch_remote
        )
        self.one_time_keys = OneTimeKeys(self.writes[device_lists.DEVICE_LISTS], self._pool)
        receipt_writes = self.writes[receipts.RECEIPTS]
        assert isinstance(receipt_writes, RoomStreamWrites)
        self.receipts = Receipts(receipt_writes, self._pool)
        self.to_device = ToDeviceInbox(self.writes[to_device.TO_DEVICE], self._pool, self._server_name)
        self.sections = StoredSections(
            self._pool, caches, self.changes, self.generators, self.to_device, self.one_time_keys.counts
        )

    async def apply(
        self, stream: str, rows: Sequence[tuple[int, Row]], writer: str | None = None
    ) -> tuple[set[str], set[str]]:
        """Record `rows` ((token, row) pairs) of `writer` (None: rows whose commit is unknown) in
        the stream's change cache; (rooms, users) to wake."""
        changes = self.changes[stream]
        rooms: set[str] = set()
        users: set[str] = set()
        for token, row in rows:
            entity: str = row[0]  # every stored stream's row starts with its entity (a user id or server)
            if stream == receipts.RECEIPTS:  # a room id
                changes.changed(entity, token)
                woken = woken_by(row)
                rooms |= woken[0]
                users |= woken[1]
                continue
            if not entity.startswith("@"):
                continue  # a remote server's queue: only the federation sender reads it
            changes.changed(entity, token, writer)
            users.add(entity)
            if stream == device_lists.DEVICE_LISTS:  # the user's room-mates see the change too
                rooms |= (await self._caches.rooms_for_user.get(entity)).rooms
        return rooms, users

    async def committed(self, stream: str, rows: Sequence[tuple[int, Row]]) -> tuple[set[str], set[str]]:
        """A local write committed: apply it here, stage its RDATA (inside the ID block); whom to
        wake once it is visible."""
        rooms, users = await self.apply(stream, rows, self.name)
        if rows:
            self._replication.stage_rows(stream, rows)
        return rooms, users

    async def uncertain(self, stream: str, stream_id: int, users: Sequence[str]) -> tuple[set[str], set[str]]:
        """A local write failed at a point where it may have committed (inside its ID block): have
        readers fetch its id from the database, and treat its users as changed here."""
        self._replication.stage_unknown(stream, stream_id)
        return await self.apply(stream, [(stream_id, (user,)) for user in users])

    def finished(self, stream: str, upto: int, woken: tuple[set[str], set[str]]) -> None:
        """A local write's IDs finished (and were published, by the generator's `on_finished`):
        wake this worker's readers once its position covers the write (writes may finish out of
        order)."""
        self._wakes[stream].add(upto, *woken)
        self._notifier.position_moved()

    def _foreign_writer(self, stream: str, instance: str) -> None:
        changes = self.changes.get(stream)
        if changes is not None:
            changes.blind()

    def _own_position(self, stream: str) -> Callable[[], int]:
        generator = self.generators[stream]
        return lambda: generator.get_current_token_for_writer(self.name)

    def follow(self, fence: Fence | None, previous_release: Callable[[], bool]) -> None:
        """The instance lease every write checks with its key's lease (None: unchecked), and
        whether workers of the previous release run: keys then stay on their stable choice, where
        those workers send them."""
        for writes in self.writes.values():
            writes.placement.by_hash = previous_release
            if writes.writer is not None:
                writes.writer.fence = fence
            if writes.leases is not None:
                writes.leases.hashed_writer = lambda key, w=writes: (  # type: ignore[misc]
                    w.hashed(key, w.writers) if previous_release() else None
                )

    async def drain(self, within_s: float) -> None:
        """A planned stop: every stream written here takes no more operations and hands its keys
        on once those running ended (`UserStreamWrites.drain`). Where PostgreSQL does not answer,
        the keys stay and move when the instance lease expires (logged, not raised)."""
        try:
            await asyncio.gather(*(writes.drain(within_s) for writes in self.writes.values()))
        except DATABASE_ERRORS as e:
            log.warning("stored-stream keys not released (PostgreSQL: %s); they move when the instance"
                        " lease expires", e or type(e).__name__)  # fmt: skip

    def set_forwarder(self, forwarder: Forwarder, owner_wait_s: float = 0.0) -> None:
        """How writes reach another worker (worker requests), once the HTTP side exists, and how
        long they keep trying a writer that restarts."""
        for writes in self.writes.values():
            writes.forwarder = forwarder
            writes.owner_wait_s = owner_wait_s


def _highest(generator: MultiWriterIdGenerator) -> int:
    """The highest position this process knows of any writer of the stream: rows at or below it
    were written before (a change cache starting here never misses one above it)."""
    return max([generator.get_current_token(), *generator.get_positions().values()])
