"""Restricted joins (join rules `restricted` and `knock_restricted`): a user joined to a room the
join rule allows joins, vouched for by a member who may invite; the stored rooms stay valid for
both judges (the spec's rules and Synapse's event_auth)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.auth_replay import judge_with_built_synapse, replay_database
from workers.harness.cluster_client import ClusterClient, RequestRefused

WRITERS = ["p1", "p2"]
AUTHORISER = "join_authorised_via_users_server"


def _restricted(space: str, rule: str = "restricted", **levels: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "initial_state": [
            {"type": "m.room.join_rules", "state_key": "",
             "content": {"join_rule": rule, "allow": [{"type": "m.room_membership", "room_id": space}]}},
        ],
    }  # fmt: skip
    if levels:
        body["power_level_content_override"] = levels
    return body


async def _refusal(request: Any) -> tuple[int, str]:
    with pytest.raises(RequestRefused) as refused:
        await request
    return refused.value.status, str(refused.value.errcode)


async def _member_content(client: ClusterClient, room: str, user: str) -> dict[str, Any]:
    state = {(e["type"], e["state_key"]): e for e in await client.room_state(room)}
    content: dict[str, Any] = state[("m.room.member", user)]["content"]
    return content


async def test_a_member_of_an_allowed_room_joins_vouched_for_by_an_admin(
    make_worker: MakeWorker, http: aiohttp.ClientSession, database_url: str
) -> None:
    workers = [await make_worker(n, WRITERS) for n in WRITERS]
    alice, bob, carol, dave = (client_for(http, workers, WRITERS) for _ in range(4))
    for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol"), (dave, "dave")):
        await client.register(name)
    alice_id, bob_id, carol_id = str(alice.user_id), str(bob.user_id), str(carol.user_id)
    space = await alice.create_room("public")
    room = await alice.create_room("invite", **_restricted(space, users={alice_id: 100, carol_id: 50}))

    assert await _refusal(bob.membership(room, "join")) == (403, "M_FORBIDDEN")  # not in the space
    await bob.membership(space, "join")
    await bob.membership(room, "join", via="p2")
    assert (await _member_content(alice, room, bob_id))[AUTHORISER] == alice_id  # the highest power
    await carol.membership(space, "join")
    await carol.set_state(room, "m.room.member", carol_id, {"membership": "join", AUTHORISER: bob_id})
    assert (await _member_content(alice, room, carol_id))[AUTHORISER] == alice_id  # the server's choice
    await alice.membership(room, "invite", target=str(dave.user_id))
    await dave.membership(room, "join")  # invited: nobody vouches
    assert AUTHORISER not in await _member_content(alice, room, str(dave.user_id))

    # The allowed room names conditions this server does not know: it cannot tell.
    odd = await alice.create_room("invite", initial_state=[
        {"type": "m.room.join_rules", "state_key": "",
         "content": {"join_rule": "restricted", "allow": [{"type": "m.other", "via": "x"}]}},
    ])  # fmt: skip
    assert await _refusal(bob.membership(odd, "join")) == (400, "M_UNABLE_TO_AUTHORISE_JOIN")
    # Nobody left who may invite: the admin left, the others are below the invite level.
    closed = await alice.create_room("invite", **_restricted(space, users={alice_id: 100}, invite=50))
    await alice.membership(closed, "invite", target=bob_id)
    await bob.membership(closed, "join")
    await alice.membership(closed, "leave")
    assert await _refusal(carol.membership(closed, "join")) == (400, "M_UNABLE_TO_GRANT_JOIN")
    # A malformed allow list is refused when set.
    malformed = {"join_rule": "restricted", "allow": "everyone"}
    assert await _refusal(alice.set_state(room, "m.room.join_rules", "", malformed)) == (400, "M_BAD_JSON")

    rooms = [space, room, odd, closed]
    result = await replay_database(database_url, rooms)
    assert not result.violations, [str(v) for v in result.violations]
    verdict = await judge_with_built_synapse(database_url, rooms)
    assert verdict.rooms == len(rooms) and not verdict.refused, str(verdict)


async def test_knock_restricted_takes_knocks_and_vouched_joins(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in WRITERS]
    alice, bob, carol = (client_for(http, workers, WRITERS) for _ in range(3))
    for client, name in ((alice, "alice"), (bob, "bob"), (carol, "carol")):
        await client.register(name)
    space = await alice.create_room("public")
    room = await alice.create_room("invite", **_restricted(space, "knock_restricted"))
    await carol.membership(room, "knock")  # not in the space: a knock is the way in
    await bob.membership(space, "join")
    await bob.membership(room, "join")
    assert (await _member_content(alice, room, str(bob.user_id)))[AUTHORISER] == str(alice.user_id)
    restricted = await alice.create_room("invite", **_restricted(space))
    assert await _refusal(carol.membership(restricted, "knock")) == (403, "M_FORBIDDEN")
