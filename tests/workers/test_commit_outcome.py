"""A write whose COMMIT answer is lost: the client's answer is the truth and readers see it once.

The persister's PostgreSQL link runs through a fault proxy that reads the protocol: a rule fires on
the COMMIT (or the Sync of a batch that is one INSERT) of the transaction carrying a marker, and
forwards it while dropping the answer, never forwards it, or forwards it after the client gave up.
The client then gets 200 exactly when the write is in the database, and a reader on another worker
sees a committed event once (and a failed one never), with writes after it going on as usual.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import ClusterClient, RequestRefused, timeline_events
from workers.harness.faultproxy import FaultProxy, OnMessage, target_of, through
from workers.harness.pg_messages import Message, is_commit, is_sync
from workers.harness.pgbouncer_server import PgBouncer

WRITER = "p1"


@pytest.fixture
async def proxy(database_url: str) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(*target_of(database_url), postgres=True) as started:
        yield started


@pytest.fixture
async def cluster(
    proxy: FaultProxy, make_worker: MakeWorker, database_url: str, http: aiohttp.ClientSession
) -> tuple[ClusterClient, str]:
    """A persister (also the account data writer) behind the proxy, a reader on the database
    directly; a registered user (on the reader) in a room of its own; (client, room id)."""
    streams = {"account_data": [WRITER]}
    persister = await make_worker(
        WRITER, [WRITER], database_url=through(database_url, proxy), stream_writers=streams
    )
    reader = await make_worker("s1", [WRITER], stream_writers=streams)
    client = client_for(http, [persister, reader], [WRITER])
    await client.register("alice", via="s1")
    room_id = await client.create_room(via=WRITER)
    return client, room_id


async def stored_events(database_url: str, marker: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM events WHERE json LIKE '%' || $1 || '%'", marker)
        )
    finally:
        await conn.close()


async def seen_by_reader(client: ClusterClient, room_id: str, marker: str) -> int:
    """How many events carrying `marker` the reader's /sync delivers, once it delivers a later one."""
    after = uuid.uuid4().hex
    await client.send(room_id, "m.room.message", {"msgtype": "m.text", "body": after}, via=WRITER)
    for _ in range(100):
        events = timeline_events(await client.sync(via="s1"))
        bodies = [str(e.get("content")) for e in events if e.get("room_id") == room_id]
        if any(after in body for body in bodies):
            return sum(marker in body for body in bodies)
        await asyncio.sleep(0.1)
    raise AssertionError("the reader never saw the write made after the fault")


async def write_with_fault(
    proxy: FaultProxy,
    match: Callable[[Message], bool],
    action: OnMessage,
    write: Callable[[str], Any],
    **options: Any,
) -> tuple[str, int]:
    """Arm the rule for the transaction carrying a fresh marker, run `write(marker)`; (marker, status)."""
    marker = uuid.uuid4().hex
    fired = proxy.on_message(match, action, after=marker.encode(), **options)
    try:
        await write(marker)
        status = 200
    except RequestRefused as e:
        status = e.status
        assert status != 503 or e.body.get("retry_after_ms", 0) > 0, e.body
    assert fired.is_set(), "the rule never fired: the write took another path"
    return marker, status


def topic(client: ClusterClient, room_id: str) -> Callable[[str], Any]:
    return lambda marker: client.set_state(room_id, "m.room.topic", "", {"topic": marker}, via=WRITER)


def message(client: ClusterClient, room_id: str) -> Callable[[str], Any]:
    return lambda marker: client.send(
        room_id, "m.room.message", {"msgtype": "m.text", "body": marker}, via=WRITER
    )


async def test_commit_done_but_its_answer_lost_answers_200_and_readers_see_it_once(
    cluster: tuple[ClusterClient, str], proxy: FaultProxy, database_url: str
) -> None:
    client, room_id = cluster
    marker, status = await write_with_fault(proxy, is_commit, OnMessage.DROP_REPLY, topic(client, room_id))
    assert status == 200
    assert await stored_events(database_url, marker) == 1
    assert await seen_by_reader(client, room_id, marker) == 1


async def test_commit_never_arriving_answers_503_and_nothing_is_written(
    cluster: tuple[ClusterClient, str], proxy: FaultProxy, database_url: str
) -> None:
    client, room_id = cluster
    marker, status = await write_with_fault(proxy, is_commit, OnMessage.NEVER_ARRIVES, topic(client, room_id))
    assert status == 503
    assert await stored_events(database_url, marker) == 0
    assert await seen_by_reader(client, room_id, marker) == 0


async def test_a_batch_cut_at_its_insert_answers_as_it_ended(
    cluster: tuple[ClusterClient, str], proxy: FaultProxy, database_url: str
) -> None:
    """A state change's batch is a transaction (its lease check runs inside it), so a connection
    lost at the INSERT's Sync, whether its answer was lost or it never arrived, ends before COMMIT:
    503, nothing written. A batch of messages is one statement with its lease check inside (it
    commits as it runs): its answer lost, the writer learns that it committed (200, seen once);
    never arrived, 503 and nothing written. Either way the client may retry."""
    client, room_id = cluster
    for fault in (OnMessage.DROP_REPLY, OnMessage.NEVER_ARRIVES):
        marker, status = await write_with_fault(proxy, is_sync, fault, topic(client, room_id))
        assert status == 503
        assert await stored_events(database_url, marker) == 0
        assert await seen_by_reader(client, room_id, marker) == 0
    marker, status = await write_with_fault(proxy, is_sync, OnMessage.DROP_REPLY, message(client, room_id))
    assert status == 200
    assert await stored_events(database_url, marker) == 1
    assert await seen_by_reader(client, room_id, marker) == 1
    marker, status = await write_with_fault(proxy, is_sync, OnMessage.NEVER_ARRIVES, message(client, room_id))
    assert status == 503
    assert await stored_events(database_url, marker) == 0
    assert await seen_by_reader(client, room_id, marker) == 0


@pytest.mark.parametrize("late_s", [0.0, 0.02, 0.2])
async def test_a_commit_arriving_after_the_client_gave_up_is_answered_as_it_ended(
    cluster: tuple[ClusterClient, str], proxy: FaultProxy, database_url: str, late_s: float
) -> None:
    """Whether the late COMMIT or the writer's termination of its backend wins, the answer and
    what readers see follow what the database holds."""
    client, room_id = cluster
    marker, status = await write_with_fault(
        proxy, is_commit, OnMessage.LATE, topic(client, room_id), late_s=late_s
    )
    await asyncio.sleep(late_s + 0.1)  # a COMMIT the proxy still held would have landed by now
    stored = await stored_events(database_url, marker)
    assert (status, stored) in ((200, 1), (503, 0))
    assert await seen_by_reader(client, room_id, marker) == stored


async def test_a_stored_stream_write_learns_its_commit_outcome(
    cluster: tuple[ClusterClient, str], proxy: FaultProxy, database_url: str
) -> None:
    client, _ = cluster

    async def put(marker: str) -> None:
        await client.put_account_data("org.example.marker", {"marker": marker}, via=WRITER)

    async def stored(marker: str) -> bool:
        conn = await asyncpg.connect(database_url)
        try:
            content = await conn.fetchval(
                "SELECT content FROM account_data WHERE user_id = $1 AND account_data_type = $2",
                client.user_id, "org.example.marker",
            )  # fmt: skip
        finally:
            await conn.close()
        return content is not None and marker in content

    marker, status = await write_with_fault(proxy, is_commit, OnMessage.DROP_REPLY, put)
    assert status == 200 and await stored(marker)
    marker, status = await write_with_fault(proxy, is_commit, OnMessage.NEVER_ARRIVES, put)
    assert status == 503 and not await stored(marker)
    # The writer goes on: the next write lands and the reader serves it.
    await put("after")
    assert await stored("after")


@pytest.fixture
async def pooled_cluster(
    pgbouncer: PgBouncer, make_worker: MakeWorker, database_url: str, http: aiohttp.ClientSession
) -> AsyncIterator[tuple[ClusterClient, str, FaultProxy]]:
    """As `cluster`, with the persister's pool through the proxy and then a PgBouncer in transaction
    mode: the backend a COMMIT went to is PgBouncer's choice, not the connection's own."""
    async with FaultProxy(*target_of(pgbouncer.through(database_url)), postgres=True) as proxy:
        streams = {"account_data": [WRITER]}
        persister = await make_worker(
            WRITER, [WRITER], database_url=through(pgbouncer.through(database_url), proxy),
            database_pooler="transaction", database_direct_url=database_url, stream_writers=streams,
        )  # fmt: skip
        reader = await make_worker("s1", [WRITER], stream_writers=streams)
        client = client_for(http, [persister, reader], [WRITER])
        await client.register("alice", via="s1")
        yield client, await client.create_room(via=WRITER), proxy


@pytest.mark.parametrize("late_s", [0.0, 0.2])
async def test_behind_pgbouncer_a_late_commit_is_answered_as_it_ended(
    pooled_cluster: tuple[ClusterClient, str, FaultProxy], database_url: str, late_s: float
) -> None:
    """Behind a transaction pooler the writer must end the backend that ran the transaction (found
    inside it), not the one the pooler's connection names: else a COMMIT arriving late lands after
    the writer decided it had not, and readers miss a stored event that its sender was told failed."""
    client, room_id, proxy = pooled_cluster
    for write in (topic(client, room_id), message(client, room_id)):
        marker, status = await write_with_fault(proxy, is_commit, OnMessage.LATE, write, late_s=late_s)
        await asyncio.sleep(late_s + 0.3)
        stored = await stored_events(database_url, marker)
        assert (status, stored) in ((200, 1), (503, 0))
        assert await seen_by_reader(client, room_id, marker) == stored
    marker, status = await write_with_fault(proxy, is_commit, OnMessage.DROP_REPLY, message(client, room_id))
    assert status == 200 and await stored_events(database_url, marker) == 1
