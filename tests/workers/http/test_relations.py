"""Relations over the Matrix API: a reaction counted once per sender however the sends race, a
relation kept inside its room, a thread not started from a related event (400, as Synapse)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import ClusterClient, RequestRefused

WRITERS = ["p1", "p2"]


def _reaction(parent: str, key: str = "+1") -> dict[str, Any]:
    return {"m.relates_to": {"rel_type": "m.annotation", "event_id": parent, "key": key}}


async def _refused(request: Any) -> tuple[int, str]:
    with pytest.raises(RequestRefused) as refused:
        await request
    return refused.value.status, str(refused.value.errcode)


async def _setup(make_worker: MakeWorker, http: aiohttp.ClientSession) -> tuple[ClusterClient, str, str]:
    workers = [await make_worker(n, WRITERS) for n in WRITERS]
    alice = client_for(http, workers, WRITERS)
    await alice.register("alice")
    room = await alice.create_room("public")
    message = (await alice.send(room, "m.room.message", {"body": "hi"}))["event_id"]
    return alice, room, str(message)


async def test_a_reaction_is_counted_once_per_sender_until_redacted(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    alice, room, message = await _setup(make_worker, http)
    first = await alice.send(room, "m.reaction", _reaction(message), txn_id="r1")
    again = await alice.send(room, "m.reaction", _reaction(message), txn_id="r1")  # a retry
    assert again["event_id"] == first["event_id"]
    assert await _refused(alice.send(room, "m.reaction", _reaction(message))) == (
        400,
        "M_DUPLICATE_ANNOTATION",
    )
    await alice.send(room, "m.reaction", _reaction(message, "-1"))  # another key
    await alice.send(room, "m.other", _reaction(message))  # another type
    await alice.redact(room, str(first["event_id"]))
    await alice.send(room, "m.reaction", _reaction(message))  # the redacted one no longer counts
    assert await _refused(alice.send(room, "m.reaction", _reaction(message))) == (
        400,
        "M_DUPLICATE_ANNOTATION",
    )


async def test_equal_reactions_racing_through_two_workers_store_one(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """Each pair is sent at once, one through each worker (one of them forwards to the room's
    writer): exactly one is stored, the other is 400, whichever lands first."""
    alice, room, _ = await _setup(make_worker, http)
    for n in range(12):
        parent = str((await alice.send(room, "m.room.message", {"body": f"m{n}"}))["event_id"])
        answers = await asyncio.gather(
            *(alice.send(room, "m.reaction", _reaction(parent), via=w) for w in WRITERS),
            return_exceptions=True,
        )
        refused = [a for a in answers if isinstance(a, RequestRefused)]
        assert len(refused) == 1 and refused[0].errcode == "M_DUPLICATE_ANNOTATION", answers
    history = await alice.messages(room, dir="b", limit=100)
    reactions = [e for e in history["chunk"] if e["type"] == "m.reaction"]
    assert len(reactions) == 12
    assert len({e["content"]["m.relates_to"]["event_id"] for e in reactions}) == 12


async def test_a_relation_stays_in_its_room_and_a_thread_starts_from_a_plain_event(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    alice, room, message = await _setup(make_worker, http)
    other_room = await alice.create_room("public")
    elsewhere = str((await alice.send(other_room, "m.room.message", {"body": "there"}))["event_id"])
    thread = {"rel_type": "m.thread", "event_id": message}
    refused = [
        alice.send(room, "m.reaction", _reaction(elsewhere)),
        alice.send(room, "m.reaction", _reaction("$never-stored")),
        alice.send(room, "m.reaction", {"m.relates_to": {"rel_type": "m.annotation", "event_id": message}}),
        alice.send(room, "m.reaction", _reaction(message, "x" * 501)),
    ]
    for request in refused:
        assert await _refused(request) == (400, "M_BAD_JSON")
    reply = str(
        (await alice.send(room, "m.room.message", {"body": "in thread", "m.relates_to": thread}))["event_id"]
    )
    nested = {"body": "nested", "m.relates_to": {"rel_type": "m.thread", "event_id": reply}}
    assert await _refused(alice.send(room, "m.room.message", nested)) == (400, "M_BAD_JSON")
    await alice.send(room, "m.room.message", {"body": "again", "m.relates_to": thread})
    # A reply (m.in_reply_to alone) is not a relation; an unknown parent another event relates to is taken.
    await alice.send(
        room, "m.room.message", {"body": "re", "m.relates_to": {"m.in_reply_to": {"event_id": "$x"}}}
    )
    await alice.send(
        room,
        "m.room.message",
        {"body": "edit", "m.relates_to": {"rel_type": "m.replace", "event_id": message}},
    )


async def test_a_new_rooms_events_relate_to_nothing_unknown(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """createRoom's `initial_state` is held to the same: a relation to another room's event is 400
    and no room is made."""
    alice, _, message = await _setup(make_worker, http)
    topic = {"type": "m.room.topic", "state_key": "", "content": {"topic": "t", "m.relates_to": {
        "rel_type": "m.reference", "event_id": message}}}  # fmt: skip
    assert await _refused(alice.create_room("public", initial_state=[topic])) == (400, "M_BAD_JSON")
