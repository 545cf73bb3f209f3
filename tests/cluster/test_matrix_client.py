"""An off-the-shelf Matrix client library (matrix-nio) drives a cluster of real worker processes.

nio validates every response against the spec's JSON schemas and answers an `...Error` object for
anything it cannot parse, so each `isinstance(..., nio.XResponse)` below is also a check of the
body's shape. The clients know nothing of routing: each talks to one worker of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import nio
import pytest

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster import LocalCluster

PASSWORD = "correct horse battery staple"


@pytest.fixture
async def cluster(make_cluster: MakeCluster) -> LocalCluster:
    return await make_cluster(background_workers=0)


@pytest.fixture
async def clients(cluster: LocalCluster) -> AsyncIterator[list[nio.AsyncClient]]:
    made = [nio.AsyncClient(url) for url in cluster.urls.values()]
    yield made
    for client in made:
        await client.close()


def on(url: str, like: nio.AsyncClient) -> nio.AsyncClient:
    """A client for `url` logged in as `like` (same user, device and token)."""
    client = nio.AsyncClient(url, like.user_id, like.device_id)
    client.restore_login(like.user_id, like.device_id, like.access_token)
    return client


async def initial_sync_until(
    client: nio.AsyncClient, done: Callable[[nio.SyncResponse], bool], within_s: float = 30.0, **options: Any
) -> nio.SyncResponse:
    """Initial syncs of `client` until `done(answer)` (the last answer after `within_s`): the
    client's worker may not have the rows yet. nio's `sync` sends its last `next_batch` when
    `since` is None, so each try clears it: otherwise every try after the first is incremental."""
    deadline = time.monotonic() + within_s
    while True:
        client.next_batch = None
        synced = await client.sync(timeout=0, **options)
        assert isinstance(synced, nio.SyncResponse), synced
        if done(synced) or time.monotonic() > deadline:
            return synced
        await asyncio.sleep(0.1)


async def alice_and_bob(clients: list[nio.AsyncClient]) -> tuple[nio.AsyncClient, nio.AsyncClient]:
    """The first two clients, registered as alice and bob."""
    for client, name in zip(clients, ("alice", "bob"), strict=False):
        assert isinstance(await client.register(name, PASSWORD), nio.RegisterResponse)
    return clients[0], clients[1]


async def test_nio_register_login_create_invite_join_send_sync(
    cluster: LocalCluster, clients: list[nio.AsyncClient]
) -> None:
    urls = list(cluster.urls.values())
    alice, bob = await alice_and_bob(clients)
    # Log in again on another worker: a second device.
    laptop = nio.AsyncClient(urls[2], "@alice:localhost")
    login = await laptop.login(PASSWORD, device_name="laptop")
    assert isinstance(login, nio.LoginResponse) and login.device_id != alice.device_id
    created = await laptop.room_create(name="Tea", topic="hot", invite=["@bob:localhost"])
    assert isinstance(created, nio.RoomCreateResponse)
    room = created.room_id
    # Another user on another worker: the invite shows once that worker has it (a long-poll wakes).
    first = await bob.sync(timeout=0, full_state=True)
    for _ in range(10):
        assert isinstance(first, nio.SyncResponse)
        if room in first.rooms.invite:
            break
        first = await bob.sync(timeout=3000)
    assert isinstance(first, nio.SyncResponse) and room in first.rooms.invite
    assert isinstance(await bob.join(room), nio.JoinResponse)

    readers = {name: on(url, bob) for name, url in cluster.urls.items()}
    since = (await readers["sync1"].sync(timeout=0)).next_batch
    sent: list[str] = []
    for i, url in zip(range(12), itertools.cycle(urls)):
        sender = on(url, alice)
        answer = await sender.room_send(room, "m.room.message", {"msgtype": "m.text", "body": f"m{i}"})
        await sender.close()
        assert isinstance(answer, nio.RoomSendResponse)
        sent.append(answer.event_id)
    # Bob syncs through randomly chosen workers: every message once, in order, tokens forward.
    got: list[str] = []
    rng = random.Random(3)
    for _ in range(30):
        reader = readers[rng.choice(sorted(readers))]
        result = await reader.sync(timeout=1000, since=since)
        assert isinstance(result, nio.SyncResponse), result
        if room in result.rooms.join:
            got += [
                e.event_id
                for e in result.rooms.join[room].timeline.events
                if isinstance(e, nio.RoomMessageText)
            ]
        since = result.next_batch
        if len(got) >= len(sent):
            break
    assert got == sent
    # A retried send (same transaction id) is the same event.
    once = await alice.room_send(room, "m.room.message", {"msgtype": "m.text", "body": "once"}, tx_id="txn-1")
    retrier = on(urls[-1], alice)
    again = await retrier.room_send(
        room, "m.room.message", {"msgtype": "m.text", "body": "once"}, tx_id="txn-1"
    )
    await retrier.close()
    assert isinstance(once, nio.RoomSendResponse) and isinstance(again, nio.RoomSendResponse)
    assert once.event_id == again.event_id
    latest = await bob.sync(timeout=5000, since=since)  # returns once "once" reached bob's worker
    assert isinstance(latest, nio.SyncResponse)
    history = await bob.room_messages(room, start=latest.next_batch, limit=50)
    assert isinstance(history, nio.RoomMessagesResponse)
    bodies = [e.body for e in history.chunk if isinstance(e, nio.RoomMessageText)]
    assert bodies.count("once") == 1
    stale = on(urls[0], bob)
    for client in (laptop, *readers.values()):
        await client.close()
    assert isinstance(await bob.logout(), nio.LogoutResponse)
    refused = await stale.sync(timeout=0)  # the token is gone on every worker
    await stale.close()
    assert isinstance(refused, nio.SyncError) and refused.status_code == "M_UNKNOWN_TOKEN"


async def test_nio_one_time_keys_upload_then_claims_on_every_worker_at_once(
    cluster: LocalCluster, clients: list[nio.AsyncClient]
) -> None:
    alice, bob = await alice_and_bob(clients)
    alg = "signed_curve25519"
    keys = {f"{alg}:K{n:03d}": {"key": f"k{n}", "signatures": {}} for n in range(40)}
    fallback = {f"{alg}:F": {"key": "f", "fallback": True, "signatures": {}}}
    # No Olm library here: nio's own request builder and response parser (with its schema check),
    # which its Olm layer calls with the keys it made.
    uploaded = await bob._send(
        nio.KeysUploadResponse,
        *nio.Api.keys_upload(bob.access_token, {"one_time_keys": keys, "fallback_keys": fallback}),
    )
    assert isinstance(uploaded, nio.KeysUploadResponse) and uploaded.signed_curve25519_count == 40
    synced = await bob.sync(timeout=0)
    assert isinstance(synced, nio.SyncResponse) and synced.device_key_count.signed_curve25519 == 40
    claimers = [on(url, alice) for url in cluster.urls.values()]
    wanted = {bob.user_id: [bob.device_id]}
    answers = await asyncio.gather(
        *(
            claimers[n % len(claimers)]._send(
                nio.KeysClaimResponse, *nio.Api.keys_claim(alice.access_token, wanted)
            )
            for n in range(50)
        )
    )
    for client in claimers:
        await client.close()
    handed = []
    for answer in answers:
        assert isinstance(answer, nio.KeysClaimResponse), answer
        handed += list(answer.one_time_keys[bob.user_id][bob.device_id])
    assert sorted(k for k in handed if k != f"{alg}:F") == sorted(keys)  # each key exactly once
    assert handed.count(f"{alg}:F") == 10
    counted = await bob._send(nio.KeysUploadResponse, *nio.Api.keys_upload(bob.access_token, {}))
    assert isinstance(counted, nio.KeysUploadResponse) and counted.signed_curve25519_count == 0


async def test_nio_receipts_read_markers_and_forget_across_workers(
    cluster: LocalCluster, clients: list[nio.AsyncClient]
) -> None:
    urls = list(cluster.urls.values())
    alice, bob = await alice_and_bob(clients)
    created = await alice.room_create(name="Seen", invite=[bob.user_id])
    assert isinstance(created, nio.RoomCreateResponse)
    room = created.room_id
    joiner = on(urls[2], bob)
    assert isinstance(await joiner.join(room), nio.JoinResponse)
    await joiner.close()
    sent = await alice.room_send(room, "m.room.message", {"msgtype": "m.text", "body": "read me"})
    assert isinstance(sent, nio.RoomSendResponse)
    first = await alice.sync(timeout=0)
    assert isinstance(first, nio.SyncResponse)
    since = first.next_batch
    bob_elsewhere = on(urls[-1], bob)
    marked = await bob_elsewhere.update_receipt_marker(room, sent.event_id)  # thread "main"
    assert isinstance(marked, nio.UpdateReceiptMarkerResponse), marked
    markers = await bob_elsewhere.room_read_markers(room, sent.event_id, private_read_event=sent.event_id)
    assert isinstance(markers, nio.RoomReadMarkersResponse), markers
    await bob_elsewhere.close()
    # alice sees bob's public receipt in the room's ephemeral events, never his private one.
    seen: list[tuple[str, str, str, str | None]] = []
    for _ in range(20):
        synced = await alice.sync(timeout=2000, since=since)
        assert isinstance(synced, nio.SyncResponse), synced
        since = synced.next_batch
        joined = synced.rooms.join.get(room)
        for event in [] if joined is None else joined.ephemeral:
            if isinstance(event, nio.ReceiptEvent):
                seen += [(r.event_id, str(r.receipt_type), r.user_id, r.thread_id) for r in event.receipts]
        if seen:
            break
    assert seen == [(sent.event_id, "m.read", bob.user_id, "main")]
    # bob's fully-read marker is his room's account data, on every worker.
    for url in urls:
        reader = on(url, bob)

        def fully_read_of(synced: nio.SyncResponse) -> list[str]:
            joined = synced.rooms.join.get(room)
            events = [] if joined is None else joined.account_data
            return [e.event_id for e in events if isinstance(e, nio.FullyReadEvent)]

        fully_read = fully_read_of(await initial_sync_until(reader, lambda s: bool(fully_read_of(s))))
        await reader.close()
        assert fully_read == [sent.event_id], url
    # Forget: refused while joined, then the room is forgotten once left.
    refused = await alice.room_forget(room)
    assert isinstance(refused, nio.RoomForgetError) and refused.status_code == "M_UNKNOWN"
    assert isinstance(await bob.room_leave(room), nio.RoomLeaveResponse)
    forgetter = on(urls[1], bob)
    assert isinstance(await forgetter.room_forget(room), nio.RoomForgetResponse)
    await forgetter.close()
    # A forgotten room is listed nowhere, even for a client that asks for left rooms.
    with_left = json.dumps({"room": {"include_leave": True}})
    for url in urls:
        reader = on(url, bob)
        after = await reader.sync(timeout=0, sync_filter=with_left)
        await reader.close()
        assert isinstance(after, nio.SyncResponse) and room not in after.rooms.leave, url


async def test_nio_redaction_removes_the_event_on_every_worker(
    cluster: LocalCluster, clients: list[nio.AsyncClient]
) -> None:
    urls = list(cluster.urls.values())
    alice, bob = await alice_and_bob(clients)
    readers = [on(url, bob) for url in urls]
    for version in ("10", "11"):
        created = await alice.room_create(name=f"v{version}", invite=[bob.user_id], room_version=version)
        assert isinstance(created, nio.RoomCreateResponse), created
        room = created.room_id
        assert isinstance(await readers[-1].join(room), nio.JoinResponse)
        body = {"msgtype": "m.text", "body": f"oops in v{version}"}
        sent = await alice.room_send(room, "m.room.message", body)
        assert isinstance(sent, nio.RoomSendResponse), sent
        # Every worker serves the message whole to bob first (and caches its body).
        since: dict[str, str] = {}
        for url, reader in zip(urls, readers, strict=True):
            for _ in range(20):
                synced = await reader.sync(timeout=2000, since=since.get(url))
                assert isinstance(synced, nio.SyncResponse), synced
                since[url] = synced.next_batch
                joined = synced.rooms.join.get(room)
                events = [] if joined is None else joined.timeline.events
                texts = [e for e in events if e.event_id == sent.event_id]
                if texts:
                    assert isinstance(texts[0], nio.RoomMessageText) and texts[0].body == body["body"]
                    break
            else:
                raise AssertionError(f"{url} never served the message")
        redacted = await alice.room_redact(room, sent.event_id, reason="typo")
        assert isinstance(redacted, nio.RoomRedactResponse), redacted
        for url, reader in zip(urls, readers, strict=True):
            heard: list[nio.RedactionEvent] = []
            for _ in range(20):
                synced = await reader.sync(timeout=2000, since=since[url])
                assert isinstance(synced, nio.SyncResponse), synced
                since[url] = synced.next_batch
                joined = synced.rooms.join.get(room)
                events = [] if joined is None else joined.timeline.events
                heard += [e for e in events if isinstance(e, nio.RedactionEvent)]
                if heard:
                    break
            assert [e.redacts for e in heard] == [sent.event_id], url
            got = await reader.room_get_event(room, sent.event_id)
            assert isinstance(got, nio.RoomGetEventResponse), got
            page = await reader.room_messages(room, limit=20)
            assert isinstance(page, nio.RoomMessagesResponse), page
            initial = await reader.sync(timeout=0, full_state=True)
            assert isinstance(initial, nio.SyncResponse), initial
            timeline = initial.rooms.join[room].timeline.events
            for event in [got.event, *(e for e in [*page.chunk, *timeline] if e.event_id == sent.event_id)]:
                assert isinstance(event, nio.RedactedEvent), (url, event)
                assert event.redacter == alice.user_id and event.reason == "typo"
                assert event.source["content"] == {}, (url, event.source)
    for reader in readers:
        await reader.close()


async def test_nio_lazy_loading_sync_carries_only_the_timelines_senders(
    cluster: LocalCluster, clients: list[nio.AsyncClient]
) -> None:
    alice, bob = await alice_and_bob(clients)
    carol, dave = clients[2], clients[3]
    for client, name in ((carol, "carol"), (dave, "dave")):
        assert isinstance(await client.register(name, PASSWORD), nio.RegisterResponse)
    created = await alice.room_create(name="Big", preset=nio.RoomPreset.public_chat)
    assert isinstance(created, nio.RoomCreateResponse)
    room = created.room_id
    for client in (bob, carol, dave):
        assert isinstance(await client.join(room), nio.JoinResponse)
    said = await bob.room_send(room, "m.room.message", {"msgtype": "m.text", "body": "from bob"})
    assert isinstance(said, nio.RoomSendResponse)
    lazy = {"room": {"state": {"lazy_load_members": True}, "timeline": {"limit": 1}}}

    def members(synced: nio.SyncResponse) -> set[str]:
        state = synced.rooms.join[room].state
        return {e.state_key for e in state if isinstance(e, nio.RoomMemberEvent)}

    def has_bobs_message(synced: nio.SyncResponse) -> bool:
        joined = synced.rooms.join.get(room)
        return joined is not None and [e.event_id for e in joined.timeline.events] == [said.event_id]

    first = await initial_sync_until(dave, has_bobs_message, sync_filter=lazy)
    assert has_bobs_message(first)
    assert members(first) == {bob.user_id, dave.user_id}  # not alice or carol: they said nothing here
    spoke = await carol.room_send(room, "m.room.message", {"msgtype": "m.text", "body": "from carol"})
    assert isinstance(spoke, nio.RoomSendResponse)
    since, later = first.next_batch, None
    for _ in range(20):
        later = await dave.sync(timeout=2000, sync_filter=lazy, since=since)
        assert isinstance(later, nio.SyncResponse), later
        since = later.next_batch
        if room in later.rooms.join and later.rooms.join[room].timeline.events:
            break
    assert isinstance(later, nio.SyncResponse)
    assert [e.event_id for e in later.rooms.join[room].timeline.events] == [spoke.event_id]
    assert members(later) == {carol.user_id}  # the new sender's member event comes with her message
