"""History visibility on every read path, per value, with a user who joins late.

Alice's room gets a message before Bob is invited, one after the invite and one after Bob joins.
What Bob reads through /messages, /event and an initial sync follows the room's
`m.room.history_visibility`; the incremental sync that carries his join says `limited` when he may
now read earlier history; a non-member reads only a `world_readable` room.
"""

from __future__ import annotations

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import RequestRefused

CASES = {
    "world_readable": ["before", "invited", "joined"],
    "shared": ["before", "invited", "joined"],
    "invited": ["invited", "joined"],
    "joined": ["joined"],
}


def _bodies(events: list[dict[str, object]]) -> list[str]:
    return [str(e["content"]["body"]) for e in events if e["type"] == "m.room.message"]  # type: ignore[index]


@pytest.mark.parametrize("visibility", list(CASES))
async def test_a_late_joiner_reads_what_the_rooms_history_visibility_allows(
    make_worker: MakeWorker, http: aiohttp.ClientSession, visibility: str
) -> None:
    worker = await make_worker("p1", ["p1"])
    alice, bob, carol = (client_for(http, [worker], ["p1"]) for _ in range(3))
    for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
        await client.register(name)
    room = await alice.create_room(
        "invite",
        initial_state=[{"type": "m.room.history_visibility", "content": {"history_visibility": visibility}}],
    )
    sent = {"before": (await alice.send(room, "m.room.message", {"body": "before"}))["event_id"]}
    await alice.membership(room, "invite", target="bob")
    sent["invited"] = (await alice.send(room, "m.room.message", {"body": "invited"}))["event_id"]
    since = (await bob.sync("p1"))["next_batch"]
    await bob.membership(room, "join")
    sent["joined"] = (await alice.send(room, "m.room.message", {"body": "joined"}))["event_id"]
    expected = CASES[visibility]

    page = await bob.messages(room, dir="b", limit=50)
    assert _bodies(page["chunk"])[::-1] == expected
    for name, event_id in sent.items():
        url = f"{bob.urls['p1']}/_matrix/client/v3/rooms/{room}/event/{event_id}"
        if name in expected:
            assert (await bob._call("GET", url))["event_id"] == event_id
        else:
            with pytest.raises(RequestRefused) as refused:
                await bob._call("GET", url)
            assert refused.value.status == 404

    initial = await bob.sync("p1")
    assert _bodies(initial["rooms"]["join"][room]["timeline"]["events"]) == expected

    joined = await bob.sync("p1", since, 0)
    timeline = joined["rooms"]["join"][room]["timeline"]
    assert _bodies(timeline["events"]) == ["joined"]  # the window's own; earlier ones through /messages
    assert timeline["limited"] is (visibility != "joined")

    if visibility == "world_readable":
        assert _bodies((await carol.messages(room, dir="b", limit=50))["chunk"])[::-1] == expected
    else:
        with pytest.raises(RequestRefused) as refused:
            await carol.messages(room, dir="b", limit=50)
        assert refused.value.status == 403


async def test_a_page_that_ends_before_a_join_shows_none_of_the_history_the_join_would_open(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    """An incremental sync pages a long window (the timeline limit): who may see what is decided at
    the end of each page. A page cut before Bob's join shows him nothing of the room's earlier
    messages (he is not in the room there); the page with his join shows what of the `shared`
    history fits beside it and says `limited` (the rest through /messages); what follows arrives
    once."""
    worker = await make_worker("p1", ["p1"])
    alice = client_for(http, [worker], ["p1"])
    bob = client_for(http, [worker], ["p1"], timeline_limit=2)
    await alice.register("alice")
    await bob.register("bob")
    room = await alice.create_room("public")
    since = (await bob.sync("p1"))["next_batch"]
    for n in range(3):
        await alice.send(room, "m.room.message", {"body": f"before{n}"})
    await bob.membership(room, "join")
    await alice.send(room, "m.room.message", {"body": "after"})
    seen: list[str] = []
    limited_at_join = None
    for _ in range(10):
        answer = await bob.sync("p1", since, 0)
        timeline = answer["rooms"]["join"].get(room, {}).get("timeline", {"events": []})
        seen += _bodies(timeline["events"])
        if any(e["type"] == "m.room.member" for e in timeline["events"]):
            limited_at_join = timeline["limited"]
        if answer["next_batch"] == since:
            break
        since = answer["next_batch"]
    assert seen == ["before2", "after"]
    assert limited_at_join is True
