"""Read receipts over the Matrix API on several in-process workers: written on the room's receipts
writer from any worker, replicated, and read by /sync's stored sections on every worker."""

from __future__ import annotations

import asyncio
import random
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from pydantic import ValidationError

from tests.workers.conftest import MakeWorker, client_for
from tests.workers.http.test_stored_streams import refused
from workers.app import Worker
from workers.harness.cluster_client import ClusterClient
from workers.routing import writer_for_room
from workers.streams.receipts import RECEIPTS, receipts_stream

WRITERS = ["p1", "p2"]
C = "/_matrix/client/v3"


async def receipt(client: ClusterClient, room: str, kind: str, event_id: str, via: str, **body: Any) -> Any:
    url = f"{client.urls[via]}{C}/rooms/{quote(room)}/receipt/{kind}/{quote(event_id)}"
    return await client._call("POST", url, body)


async def seen(
    worker: Worker, client: ClusterClient, since: str | None = None, until: Any = None
) -> dict[str, Any]:
    """The `m.receipt` events `client` gets from /sync's stored sections on `worker` (after
    `since`), polled until `until(events)` holds (replication takes a moment)."""
    assert worker.sync is not None and worker.sync.stored is not None and client.user_id
    for _ in range(100):
        rooms = await worker.caches.rooms_for_user.get(client.user_id)
        low = None if since is None else await worker.sync.decode(since)
        now = worker.sync.current_token()
        updates, _ = await worker.sync.stored.collect(client.user_id, None, rooms, low, now, [])
        if until is None or until(updates.receipts):
            return updates.receipts
        await asyncio.sleep(0.05)
    raise AssertionError(f"not seen on {worker.name}: {updates.receipts}")


def readers(events: dict[str, Any], room: str, event_id: str, kind: str = "m.read") -> set[str]:
    return set(events.get(room, {}).get("content", {}).get(event_id, {}).get(kind, {}))


async def test_receipts_from_any_worker_reach_every_worker_and_private_ones_only_their_owner(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in ("p1", "p2", "r1")]
    alice, bob, carol, dave = (client_for(http, workers, WRITERS) for _ in range(4))
    for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol"), (dave, "dave")):
        await client.register(name, via="r1")
    room = await alice.create_room("public", via="p1")
    for client in (bob, carol):
        await client.membership(room, "join", via="r1")
    e1 = (await alice.send(room, "m.room.message", {"body": "one"}, via="p2"))["event_id"]
    e2 = (await alice.send(room, "m.room.message", {"body": "two"}, via="p2"))["event_id"]
    since = (await alice.sync("r1"))["next_batch"]
    # From workers that do not write the room's receipts: forwarded to its writer.
    other = next(w for w in WRITERS if w != writer_for_room(room, WRITERS))
    assert await receipt(bob, room, "m.read", e2, via="r1") == {}
    assert await receipt(carol, room, "m.read.private", e2, via=other) == {}
    markers = f"{alice.urls['p1']}{C}/rooms/{quote(room)}/read_markers"
    assert await alice._call("POST", markers, {"m.fully_read": e1, "m.read": e1}) == {}
    for worker in workers:
        got = await seen(worker, alice, since, lambda r: readers(r, room, e1) and readers(r, room, e2))
        assert readers(got, room, e2) == {bob.user_id} and readers(got, room, e1) == {alice.user_id}
        assert readers(got, room, e2, "m.read.private") == set()  # carol's stays hers
        data = got[room]["content"][e2]["m.read"][bob.user_id]
        assert isinstance(data["ts"], int) and "thread_id" not in data
        mine = await seen(worker, carol, since, lambda r: readers(r, room, e2, "m.read.private"))
        assert readers(mine, room, e2, "m.read.private") == {carol.user_id}
    # An initial sync gets every receipt the room holds.
    assert readers(await seen(workers[2], alice), room, e2) == {bob.user_id}
    # Back in history: the receipt stays where it is, and no stream ID is taken.
    async with workers[2].pool.acquire() as conn:
        before = await conn.fetchval("SELECT last_value FROM receipts_stream_seq")
        assert await receipt(bob, room, "m.read", e1, via="p1") == {}
        assert await receipt(bob, room, "m.read", e2, via="p2") == {}  # the same again
        assert await conn.fetchval("SELECT last_value FROM receipts_stream_seq") == before
        assert await conn.fetchval("SELECT event_id FROM receipts WHERE user_id = $1", bob.user_id) == e2
    # A threaded receipt is a receipt of its own, with its thread in the data.
    since = (await alice.sync("r1"))["next_batch"]
    assert await receipt(bob, room, "m.read", e1, via="r1", thread_id="main") == {}
    got = await seen(workers[2], alice, since, lambda r: readers(r, room, e1))
    ts = got[room]["content"][e1]["m.read"][bob.user_id]["ts"]
    assert got[room]["content"] == {e1: {"m.read": {bob.user_id: {"ts": ts, "thread_id": "main"}}}}
    # m.fully_read through the receipt endpoint is the read marker.
    assert await receipt(alice, room, "m.fully_read", e2, via="r1") == {}
    user = quote(alice.user_id or "")
    direct = f"{alice.urls['r1']}{C}/user/{user}/rooms/{quote(room)}/account_data/m.fully_read"
    assert await alice._call("GET", direct) == {"event_id": e2}
    # Refusals.
    assert await refused(receipt(dave, room, "m.read", e2, via="r1")) == (403, "M_FORBIDDEN")
    assert await refused(receipt(bob, room, "m.read", "$nosuchevent", via="r1")) == (404, "M_NOT_FOUND")
    assert await refused(receipt(bob, room, "m.unknown", e2, via="r1")) == (400, "M_UNKNOWN")
    assert await refused(receipt(bob, room, "m.read", "no-sigil", via="r1")) == (400, "M_INVALID_PARAM")
    for body in ({"thread_id": ""}, {"thread_id": 5}):
        assert await refused(receipt(bob, room, "m.read", e2, via="r1", **body)) == (400, "M_INVALID_PARAM")
    fully = receipt(bob, room, "m.fully_read", e2, via="r1", thread_id="main")
    assert await refused(fully) == (400, "M_INVALID_PARAM")


async def one_worker_room(
    make_worker: MakeWorker, http: aiohttp.ClientSession, messages: int
) -> tuple[Worker, ClusterClient, str, list[str]]:
    """One worker, alice, her room and the ids of the `messages` she sent into it."""
    worker = await make_worker("p1", ["p1"])
    alice = client_for(http, [worker], ["p1"])
    await alice.register("alice")
    room = await alice.create_room("public")
    sent = [(await alice.send(room, "m.room.message", {"body": str(n)}))["event_id"] for n in range(messages)]
    return worker, alice, room, sent


async def test_a_token_from_before_receipts_reads_them_from_the_start(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker, alice, room, [sent] = await one_worker_room(make_worker, http, 1)
    assert await receipt(alice, room, "m.read", sent, via="p1") == {}
    token = (await alice.sync("p1"))["next_batch"]
    older = token.rsplit("_", 1)[0]  # the receipts component is the last one
    assert worker.sync is not None
    assert (await worker.sync.decode(older)).get("receipts").stream == 0
    answer = await alice.sync("p1", older, 0)
    assert answer["next_batch"].count("_") == token.count("_")
    assert readers(await seen(worker, alice, older), room, sent) == {alice.user_id}
    assert readers(await seen(worker, alice, token), room, sent) == set()


async def test_catch_up_reads_receipt_rows_in_synapse_grammar_and_the_wire_refuses_bad_ones(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker, alice, room, sent = await one_worker_room(make_worker, http, 2)
    await receipt(alice, room, "m.read", sent[0], via="p1")
    await receipt(alice, room, "m.read.private", sent[1], via="p1", thread_id="main")
    await receipt(alice, room, "m.read", sent[1], via="p1")  # replaces the first, at a newer id
    stream = receipts_stream(worker.pool, worker.generators[RECEIPTS], ["p1"])
    rows = await stream.update_function("p1", 0, worker.generators[RECEIPTS].get_current_token(), 10)
    assert [row[:5] for _, row in rows] == [
        (room, "m.read.private", alice.user_id, sent[1], "main"),
        (room, "m.read", alice.user_id, sent[1], None),
    ]
    assert [token for token, _ in rows] == sorted(token for token, _ in rows)
    wire = stream.encode_payload(rows[1][1])
    assert wire.startswith(f'["{room}","m.read","{alice.user_id}","{sent[1]}",null,{{"ts":')
    assert stream.parse_payload(wire, numbered=False)[0] == rows[1][1]
    for bad in (
        f'["{room}","m.read","{alice.user_id}","{sent[1]}",null,"not an object"]',
        f'["{room}","","{alice.user_id}","{sent[1]}",null,{{}}]',
        f'["a room\\n","m.read","{alice.user_id}","{sent[1]}",null,{{}}]',
    ):
        with pytest.raises(ValidationError):
            stream.parse_payload(bad, numbered=False)


async def test_receipts_racing_from_two_workers_only_ever_move_forward(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, ["p1"]) for n in ("p1", "r1")]
    alice, bob, carol = (client_for(http, workers, ["p1"]) for _ in range(3))
    for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
        await client.register(name, via="r1")
    room = await alice.create_room("public", via="p1")
    for client in (bob, carol):
        await client.membership(room, "join", via="r1")
    sent = [(await alice.send(room, "m.room.message", {"body": str(n)}))["event_id"] for n in range(20)]
    rng = random.Random(7)
    posts = [(client, event_id) for client in (bob, carol) for event_id in sent]
    rng.shuffle(posts)
    await asyncio.gather(
        *(
            receipt(client, room, "m.read", event_id, via=("p1", "r1")[n % 2])
            for n, (client, event_id) in enumerate(posts)
        )
    )
    for worker in workers:
        got = await seen(
            worker, alice, None, lambda r: readers(r, room, sent[-1]) == {bob.user_id, carol.user_id}
        )
        assert set(got[room]["content"]) == {sent[-1]}  # nobody's receipt stayed behind
    async with workers[0].pool.acquire() as conn:
        rows = await conn.fetch("SELECT user_id, event_id FROM receipts WHERE room_id = $1", room)
    assert sorted((r["user_id"], r["event_id"]) for r in rows) == sorted(
        [(bob.user_id, sent[-1]), (carol.user_id, sent[-1])]
    )
