"""A room lists only aliases that lead to it: no room takes another's address (400 M_BAD_ALIAS, as
the spec has the server check and Synapse answers), in a state event or in createRoom's."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import RequestRefused

WRITERS = ["p1", "p2"]
ALIAS = "m.room.canonical_alias"


async def _refused(request: Any) -> tuple[int, str]:
    with pytest.raises(RequestRefused) as refused:
        await request
    return refused.value.status, str(refused.value.errcode)


async def test_a_room_lists_only_aliases_that_lead_to_it(
    make_worker: MakeWorker, http: aiohttp.ClientSession
) -> None:
    workers = [await make_worker(n, WRITERS) for n in WRITERS]
    alice = client_for(http, workers, WRITERS)
    await alice.register("alice")
    main = await alice.create_room("public", room_alias_name="main")
    other = await alice.create_room("public")
    for content, answer in [
        ({"alias": "#main:localhost"}, (400, "M_BAD_ALIAS")),
        ({"alt_aliases": ["#main:localhost"]}, (400, "M_BAD_ALIAS")),
        ({"alias": "#nowhere:localhost"}, (400, "M_BAD_ALIAS")),
        ({"alias": "main"}, (400, "M_BAD_ALIAS")),
        ({"alias": 7}, (400, "M_INVALID_PARAM")),  # as Synapse answers a value of the wrong type
        ({"alt_aliases": "#main:localhost"}, (400, "M_INVALID_PARAM")),
    ]:
        assert await _refused(alice.set_state(other, ALIAS, "", content)) == answer, content
    assert not any(e["type"] == ALIAS for e in await alice.room_state(other))
    await alice.set_state(main, ALIAS, "", {"alias": "#main:localhost", "alt_aliases": ["#main:localhost"]})
    await alice.set_state(main, ALIAS, "", {})  # dropping an alias is never checked
    spoof = [{"type": ALIAS, "state_key": "", "content": {"alias": "#main:localhost"}}]
    assert await _refused(alice.create_room("public", initial_state=spoof)) == (400, "M_BAD_ALIAS")
    own = [{"type": ALIAS, "state_key": "", "content": {"alias": "#own:localhost", "alt_aliases": []}}]
    made = await alice.create_room("public", room_alias_name="own", initial_state=own)
    state = {(e["type"], e["state_key"]): e for e in await alice.room_state(made)}
    assert state[(ALIAS, "")]["content"]["alias"] == "#own:localhost"
