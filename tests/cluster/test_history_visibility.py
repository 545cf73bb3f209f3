"""History visibility on a cluster of worker processes: each value, a user who joins late, the
room written through one persister and read through every other worker."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.cluster.conftest import MakeCluster
from workers.harness.cluster_client import ClusterClient, RequestRefused

EXPECTED = {
    "world_readable": ["before", "invited", "joined"],
    "shared": ["before", "invited", "joined"],
    "invited": ["invited", "joined"],
    "joined": ["joined"],
}


def _bodies(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["content"]["body"]) for e in events if e["type"] == "m.room.message"]


async def test_every_visibility_value_on_every_worker(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(background_workers=0)
    urls = cluster.urls
    async with aiohttp.ClientSession() as session:
        alice, bob, carol = (ClusterClient(session, urls) for _ in range(3))
        for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
            await client.register(name, via="persister1")
        rooms: dict[str, str] = {}
        for visibility in EXPECTED:
            state = [{"type": "m.room.history_visibility", "content": {"history_visibility": visibility}}]
            room = rooms[visibility] = await alice.create_room(
                "invite", via="persister1", initial_state=state
            )
            await alice.send(room, "m.room.message", {"body": "before"})
            await alice.membership(room, "invite", "bob")
            await alice.send(room, "m.room.message", {"body": "invited"})
            await bob.membership(room, "join")
            await alice.send(room, "m.room.message", {"body": "joined"}, via="persister2")
        for worker in urls:
            for visibility, room in rooms.items():
                expected = EXPECTED[visibility]
                page: dict[str, Any] = {}
                for _ in range(50):  # until this worker has alice's last message
                    page = await bob.messages(room, via=worker, dir="b", limit=50)
                    if _bodies(page["chunk"])[:1] == ["joined"]:
                        break
                assert _bodies(page["chunk"])[::-1] == expected, (worker, visibility)
                initial = await bob.sync(worker)
                assert _bodies(initial["rooms"]["join"][room]["timeline"]["events"]) == expected
                if visibility == "world_readable":
                    outside = await carol.messages(room, via=worker, dir="b", limit=50)
                    assert _bodies(outside["chunk"])[::-1] == expected
                else:
                    with pytest.raises(RequestRefused) as refused:
                        await carol.messages(room, via=worker, dir="b", limit=50)
                    assert refused.value.status == 403
