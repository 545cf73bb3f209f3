"""Fixtures for pubsub integration tests: a test stream in Postgres, nodes (generator + client), waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import asyncpg
import pytest

from pubsub.client import ReplicationClient, ReplicationSettings
from pubsub.streams import Stream
from pubsub.types import DropFilter, Row
from tests.conftest import RedisTarget

STREAM = "test_rows"
SCHEMA = """
CREATE TABLE IF NOT EXISTS test_rows (
    stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL, seq INT NOT NULL, payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS test_rows_idx ON test_rows (instance_name, stream_id);
CREATE SEQUENCE IF NOT EXISTS test_rows_seq;
"""


class TestRow(NamedTuple):
    writer: str
    seq: int
    payload: str


async def wait_for(condition: Callable[[], bool], limit_s: float = 15.0, what: str = "condition") -> float:
    """Poll `condition` every 10 ms; return the seconds it took, fail after `limit_s`."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > limit_s:
            raise AssertionError(f"timed out after {limit_s}s waiting for {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def check_history(applied: Sequence[tuple[str, int, int]], expected: dict[str, list[int]]) -> None:
    """`applied`: (writer, token, seq) in application order. Every expected seq of every writer exactly
    once, tokens non-decreasing per writer, seqs in write order per writer. Raises AssertionError."""
    per_writer: dict[str, list[tuple[int, int]]] = {}
    for writer, token, seq in applied:
        per_writer.setdefault(writer, []).append((token, seq))
    for writer, want in expected.items():
        got = per_writer.get(writer, [])
        seqs = [s for _, s in got]
        dupes = {s for s in seqs if seqs.count(s) > 1}
        assert not dupes, f"{writer}: applied more than once: {sorted(dupes)[:10]}"
        missing = sorted(set(want) - set(seqs))
        assert not missing, f"{writer}: missing {len(missing)} rows, first {missing[:10]}"
        extra = sorted(set(seqs) - set(want))
        assert not extra, f"{writer}: unexpected rows {extra[:10]}"
        tokens = [t for t, _ in got]
        assert tokens == sorted(tokens), f"{writer}: tokens out of order"
        assert seqs == sorted(seqs), f"{writer}: rows out of write order"


@dataclass
class Node:
    """One simulated worker process: its generator, its replication client, what it applied."""

    name: str
    pool: asyncpg.Pool
    generator: Any
    client: ReplicationClient
    applied: list[tuple[str, int, int]] = field(default_factory=list)
    written: list[int] = field(default_factory=list)
    seq: int = 0

    async def write(self, count: int, rows_per_token: int = 1) -> None:
        """Persist `count` tokens (each with `rows_per_token` rows) and stage them for publishing."""
        for _ in range(count):
            async with self.generator.get_next() as token:
                rows = []
                for _ in range(rows_per_token):
                    self.seq += 1
                    rows.append(TestRow(writer=self.name, seq=self.seq, payload=f"p{self.seq}"))
                await self.pool.executemany(
                    "INSERT INTO test_rows (stream_id, instance_name, seq, payload) VALUES ($1, $2, $3, $4)",
                    [(token, self.name, r.seq, r.payload) for r in rows],
                )
                self.client.stage_rows(STREAM, [(token, r) for r in rows])
                self.written.extend(r.seq for r in rows)
            self.client.notify(STREAM)

    async def write_many(self, count: int, pad: int = 0) -> None:
        """`count` rows with one ID each, allocated in one round trip; payloads padded by `pad` bytes."""
        async with self.generator.get_next_mult(count) as tokens:
            rows = []
            for _ in tokens:
                self.seq += 1
                rows.append(TestRow(writer=self.name, seq=self.seq, payload=f"p{self.seq}" + "x" * pad))
            await self.pool.executemany(
                "INSERT INTO test_rows (stream_id, instance_name, seq, payload) VALUES ($1, $2, $3, $4)",
                [(t, self.name, r.seq, r.payload) for t, r in zip(tokens, rows, strict=True)],
            )
            self.client.stage_rows(STREAM, zip(tokens, rows, strict=True))
            self.written.extend(r.seq for r in rows)
        self.client.notify(STREAM)

    def applied_count(self, writer: str | None = None) -> int:
        return sum(1 for w, _, _ in self.applied if writer is None or w == writer)

    def metric(self, name: str, **labels: str) -> float:
        return self.client.metrics.value(name, labels)


def update_function(
    pool: asyncpg.Pool,
) -> Callable[[str, int, int, int], Awaitable[list[tuple[int, TestRow]]]]:
    async def fetch(instance: str, from_token: int, to_token: int, limit: int) -> list[tuple[int, TestRow]]:
        records = await pool.fetch(
            "SELECT stream_id, seq, payload FROM test_rows WHERE instance_name = $1 AND stream_id > $2"
            " AND stream_id <= $3 ORDER BY stream_id, seq LIMIT $4",
            instance,
            from_token,
            to_token,
            limit,
        )
        return [
            (r["stream_id"], TestRow(writer=instance, seq=r["seq"], payload=r["payload"])) for r in records
        ]

    return fetch


NodeFactory = Callable[..., Awaitable[Node]]


async def keep_writing(node: Node, stop: asyncio.Event) -> None:
    """Two rows a token every 10 ms until `stop` is set."""
    while not stop.is_set():
        await node.write(1, rows_per_token=2)
        await asyncio.sleep(0.01)


async def fault_mid_stream(
    reader: Node, writer: Node, fault: Callable[[], Awaitable[None]], limit_s: float = 30.0
) -> None:
    """`writer` keeps writing; once `reader` applied 20 rows, `fault` runs. Then the reader must
    apply 20 rows written after the fault and, once the writer stopped, every row exactly once, in
    order (`check_history`)."""
    stop = asyncio.Event()
    load = asyncio.create_task(keep_writing(writer, stop))
    try:
        await wait_for(lambda: reader.applied_count() >= 20, what="rows before the fault")
        await fault()
        count = len(writer.written)
        await wait_for(lambda: reader.applied_count() >= count + 20, limit_s, "live rows after the fault")
    finally:
        stop.set()
        await load
    await wait_for(lambda: reader.applied_count() == len(writer.written), limit_s, "every row")
    check_history(reader.applied, {writer.name: writer.written})


async def publish_raw(redis: str | RedisTarget, channel_prefix: str, lines: Sequence[bytes | str]) -> None:
    """Publish `lines` on the cluster's base channel with a plain client, as a forger would."""
    from pubsub import keys

    target = RedisTarget(redis) if isinstance(redis, str) else redis
    await target.publish(keys.base_channel(channel_prefix), lines)


@pytest.fixture
async def test_stream_db(db_pool: asyncpg.Pool) -> asyncpg.Pool:
    async with db_pool.acquire() as conn:
        await conn.execute(SCHEMA)
    return db_pool


@pytest.fixture
async def make_node(
    test_stream_db: asyncpg.Pool, redis_target: RedisTarget, channel_prefix: str
) -> AsyncIterator[NodeFactory]:
    """`await make_node(name, writers=[...], start=True, **settings)` builds a node on `redis_target`
    (`url=` a server of the test's own instead); all stop at teardown."""
    from idgen.multi_writer import MultiWriterIdGenerator

    nodes: list[Node] = []

    async def build(
        name: str,
        *,
        writers: Sequence[str] = ("w1",),
        start: bool = True,
        url: str | None = None,
        target: RedisTarget | None = None,
        read: Sequence[str] | None = None,
        drop_filter: DropFilter | None = None,
        announce_interval_s: float = 0.2,
        **settings: Any,
    ) -> Node:
        pool = test_stream_db
        generator = await MultiWriterIdGenerator.create(
            pool,
            stream_name=STREAM,
            instance_name=name,
            tables=[("test_rows", "instance_name", "stream_id")],
            sequence_name="test_rows_seq",
            writers=list(writers),
        )
        stream = Stream(STREAM, TestRow, update_function(pool), generator, writers)
        target = target or (redis_target if url is None else RedisTarget(url))
        where = {k: tuple(v) if k == "redis_cluster" else v for k, v in target.settings().items()}
        config = ReplicationSettings(
            instance_name=name,
            **{**where, **settings},
            channel_prefix=channel_prefix,
            announce_interval_s=announce_interval_s,
        )
        node_ref: list[Node] = []

        async def apply(
            stream: Stream[Any], instance: str, token: int, rows: Sequence[tuple[int, Row]]
        ) -> None:
            for _, row in rows:
                assert isinstance(row, TestRow)
                node_ref[0].applied.append((instance, token, row.seq))

        client = ReplicationClient(config, [stream], apply=apply, read=read, drop_filter=drop_filter)
        node = Node(name, pool, generator, client)
        node_ref.append(node)
        nodes.append(node)
        if start:
            await client.start()
        return node

    yield build
    for node in nodes:
        await node.client.stop()
        await node.generator.close()
