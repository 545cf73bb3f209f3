"""Readers woken alike share one /sync answer (`workers.handlers.sync.shared_answers`): one body,
encoded once; readers whose answers differ (their filter, their own membership in the window,
what they may see, their own news) each get their own.

The handler of a real worker is asked directly, with one `since` for every reader, so the readers'
windows are the same span and nothing but the reader differs."""

from __future__ import annotations

import aiohttp

from tests.workers.conftest import MakeWorker, client_for
from workers.app import Worker
from workers.handlers.sync.filter import SyncFilter
from workers.harness.cluster_client import ClusterClient


async def _members(worker: Worker, http: aiohttp.ClientSession, names: list[str]) -> list[ClusterClient]:
    users = [client_for(http, [worker], ["p1"]) for _ in names]
    for user, name in zip(users, names, strict=True):
        await user.register(name)
    return users


async def _since(worker: Worker) -> str:
    assert worker.sync is not None
    return await worker.sync.encode(worker.sync.current_token())


async def test_readers_of_one_room_with_one_filter_share_one_body_encoded_once(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"])
    handler = worker.sync
    assert handler is not None
    alice, bob, carol = await _members(worker, http, ["alice", "bob", "carol"])
    room = await alice.create_room("public")
    for user in (bob, carol):
        await user.membership(room, "join")
    since = await _since(worker)
    await alice.send(room, "m.room.message", {"body": "hello"})
    built, shared = handler.answers.built, handler.answers.shared
    first = await handler.sync("@bob:localhost", since, 0)
    second = await handler.sync("@carol:localhost", since, 0)
    assert second is first
    assert handler.answers.encode(second) is handler.answers.encode(first)
    assert (handler.answers.built, handler.answers.shared) == (built + 1, shared + 1)
    timeline = first["rooms"]["join"][room]["timeline"]["events"]
    assert [e["content"]["body"] for e in timeline] == ["hello"]
    # Over HTTP too: both readers read the same bytes.
    bodies = [await user.sync("p1", since, 0) for user in (bob, carol)]
    assert bodies[0] == bodies[1]


async def test_a_reader_with_another_filter_or_its_own_join_in_the_window_is_answered_alone(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    worker = await make_worker("p1", ["p1"])
    handler = worker.sync
    assert handler is not None
    alice, bob, carol, dave = await _members(worker, http, ["alice", "bob", "carol", "dave"])
    room = await alice.create_room(
        "public",
        initial_state=[{"type": "m.room.history_visibility", "content": {"history_visibility": "joined"}}],
    )
    for user in (bob, carol):
        await user.membership(room, "join")
    since = await _since(worker)
    await alice.send(room, "m.room.message", {"body": "before dave"})
    await dave.membership(room, "join")
    await alice.send(room, "m.room.message", {"body": "after dave"})

    bob_body = await handler.sync("@bob:localhost", since, 0)
    no_messages = SyncFilter.parse({"room": {"timeline": {"not_types": ["m.room.message"]}}})
    carol_body = await handler.sync("@carol:localhost", since, 0, sync_filter=no_messages)
    assert carol_body is not bob_body
    assert [e["type"] for e in carol_body["rooms"]["join"][room]["timeline"]["events"]] == ["m.room.member"]
    # Dave's window holds his own join, and `joined` visibility hides what came before it.
    dave_body = await handler.sync("@dave:localhost", since, 0)
    assert dave_body is not bob_body
    dave_timeline = [e["content"].get("body") for e in dave_body["rooms"]["join"][room]["timeline"]["events"]]
    assert dave_timeline == [None, "after dave"]
    assert handler.answers.shared == 0
