"""/sync through every membership change, against a model of the spec's rules.

Random sequences of membership changes of one user (join, leave, invite, re-invite, knock, kick,
ban, unban) in a public room and a knock room, with messages and renames by the rooms' owner and
syncs at random points, run on a real worker. The model below is written from the spec and
Synapse's behaviour, not from the handler: for each window (since, next_batch] and room, from the
user's own membership events in the window,
* none, or the last is a join: `join`, with every event the user may see;
* the last is a leave or ban: `leave`, with every event the user may see (up to it);
* the last is an invite or knock: `invite` / `knock`, whose stripped state is the room as of
  that event (its name then) and ends with the event itself; with a leave or ban in the window
  too, also `leave`, with the visible events up to the last of them. An invite or knock that a
  later one supersedes in the same window, with no leave, ban or join between, is not delivered.
An event is visible when it is the user's own member event, or the user is joined just after it,
or the user joins later in the same window and the room's history visibility at the event lets
it see the event (`shared` or `world_readable`; `invited` when the user was invited then). The
owner changes the history visibility at random too.
Every answer is compared whole: the rooms of each section, each timeline, each pending event and
the name its stripped state shows. At the end an initial sync lists the pending rooms the same way.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.workers.conftest import MakeWorker, client_for
from workers.harness.cluster_client import ClusterClient
from workers.harness.history import events_token

PENDING = ("invite", "knock")
ENDED = ("leave", "ban")


@dataclass(frozen=True)
class Stored:
    ordering: int
    event_id: str
    room_id: str
    type: str
    state_key: str | None
    content: dict[str, object]


@dataclass
class Expected:
    join: dict[str, list[str]]
    leave: dict[str, list[str]]
    pending: dict[str, dict[str, tuple[str, str | None]]]  # section -> room -> (event id, name then)


def model(
    user: str,
    before: dict[str, str | None],
    window: list[Stored],
    names: dict[str, str | None],
    visibility: dict[str, str],
) -> Expected:
    """What the answer for `window` must hold. `before`: the user's membership per room at the
    window's start; `names`, `visibility`: each room's name and history visibility then (all
    three updated in place)."""
    out = Expected({}, {}, {"invite": {}, "knock": {}})
    by_room: dict[str, list[Stored]] = {}
    for event in window:
        by_room.setdefault(event.room_id, []).append(event)
    order = ("world_readable", "shared", "invited", "joined")
    for room, events in by_room.items():
        membership = before.get(room)
        # Per event: (is own member event, membership just after it, visibility in force at it).
        facts: list[tuple[bool, str | None, str]] = []
        for event in events:
            rule = visibility[room]
            if event.type == "m.room.history_visibility":
                visibility[room] = str(event.content.get("history_visibility"))
                rule = min(rule, visibility[room], key=order.index)  # the wider side of a change
            mine = event.type == "m.room.member" and event.state_key == user
            if mine:
                membership = str(event.content["membership"])
            facts.append((mine, membership, rule))
        before[room] = membership
        joins = [i for i, (mine, m, _) in enumerate(facts) if mine and m == "join"]
        visible: list[Stored] = []
        own: list[tuple[int, str, str | None]] = []  # (index in visible, membership, name then)
        for i, (event, (mine, at, rule)) in enumerate(zip(events, facts, strict=True)):
            if event.type == "m.room.name":
                names[room] = str(event.content.get("name"))
            joins_later = any(j > i for j in joins)
            shared = rule in ("world_readable", "shared") or (rule == "invited" and at == "invite")
            if mine or at == "join" or (joins_later and shared):
                visible.append(event)
            if mine:
                own.append((len(visible) - 1, str(at), names.get(room)))
        ids = [e.event_id for e in visible]
        if not own or own[-1][1] == "join":
            if ids:
                out.join[room] = ids
        elif own[-1][1] in ENDED:
            out.leave[room] = ids
        else:
            index, kind, name = own[-1]
            out.pending[kind][room] = (visible[index].event_id, name)
            ended = [i for i, m, _ in own if m in ENDED]
            if ended:
                out.leave[room] = ids[: ended[-1] + 1]
    return out


def actual(body: dict[str, object]) -> Expected:
    rooms = body["rooms"]
    assert isinstance(rooms, dict)
    out = Expected(
        {r: [e["event_id"] for e in v["timeline"]["events"]] for r, v in rooms["join"].items()},
        {r: [e["event_id"] for e in v["timeline"]["events"]] for r, v in rooms["leave"].items()},
        {"invite": {}, "knock": {}},
    )
    for kind in PENDING:
        for room, value in rooms[kind].items():
            stripped = value[f"{kind}_state"]["events"]
            assert "event_id" in stripped[-1] and all("event_id" not in e for e in stripped[:-1])
            assert [e["type"] for e in stripped].count("m.room.member") == 1  # only the event itself
            name = next((e["content"]["name"] for e in stripped if e["type"] == "m.room.name"), None)
            out.pending[kind][room] = (stripped[-1]["event_id"], name)
    return out


#: The moves each membership allows, as (who acts, what): "me" is the user under test.
MOVES = {
    None: [("owner", "invite"), ("me", "join"), ("me", "knock"), ("owner", "ban")],
    "leave": [("owner", "invite"), ("me", "join"), ("me", "knock"), ("owner", "ban")],
    "invite": [("me", "join"), ("me", "leave"), ("owner", "kick"), ("owner", "invite"), ("owner", "ban")],
    "knock": [("owner", "invite"), ("owner", "kick"), ("me", "leave"), ("owner", "ban")],
    "join": [("me", "leave"), ("owner", "kick"), ("owner", "ban"), ("me", "send")],
    "ban": [("owner", "unban")],
}
ALWAYS = [("owner", "send"), ("owner", "rename"), ("owner", "visibility"), ("me", "sync"), ("me", "sync")]
VISIBILITIES = ("world_readable", "shared", "invited", "joined")


async def _window(pool: asyncpg.Pool, rooms: list[str], since: str, upto: str) -> list[Stored]:
    low, high = events_token(since).stream, events_token(upto).stream
    async with pool.acquire() as conn:
        records = await conn.fetch(
            "SELECT stream_ordering, event_id, room_id, type, state_key, json FROM events"
            " WHERE room_id = ANY($1::text[]) AND stream_ordering > $2 AND stream_ordering <= $3"
            " ORDER BY stream_ordering",
            rooms,
            low,
            high,
        )
    return [
        Stored(r["stream_ordering"], r["event_id"], r["room_id"], r["type"], r["state_key"],
               json.loads(r["json"])["content"])
        for r in records
    ]  # fmt: skip


async def _move(owner: ClusterClient, me: ClusterClient, room: str, who: str, what: str, n: int) -> None:
    user = str(me.user_id)
    if what == "send":
        await (owner if who == "owner" else me).send(room, "m.room.message", {"body": f"m{n}"})
    elif what == "rename":
        await owner.set_state(room, "m.room.name", "", {"name": f"name{n}"})
    elif what == "visibility":
        value = VISIBILITIES[n % len(VISIBILITIES)]
        await owner.set_state(room, "m.room.history_visibility", "", {"history_visibility": value})
    elif who == "me":
        await me.membership(room, what)
    else:
        await owner.membership(room, {"kick": "leave"}.get(what, what), target=user)


@dataclass
class Setup:
    owner: ClusterClient
    me: ClusterClient
    pool: asyncpg.Pool


@pytest.fixture
async def setup(
    make_worker: MakeWorker, http: aiohttp.ClientSession, database_url: str
) -> AsyncIterator[Setup]:
    worker = await make_worker("p1", ["p1"])
    owner, me = client_for(http, [worker], ["p1"]), client_for(http, [worker], ["p1"])
    await owner.register("owner")
    await me.register("me")
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    yield Setup(owner, me, pool)
    await pool.close()


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
async def test_every_answer_matches_the_spec_model_through_random_membership_changes(
    setup: Setup, data: st.DataObject
) -> None:
    owner, me, pool = setup.owner, setup.me, setup.pool
    user = str(me.user_id)
    public = await owner.create_room("public", name="start")
    knock = await owner.create_room(
        "invite",
        name="start",
        initial_state=[{"type": "m.room.join_rules", "content": {"join_rule": "knock"}}],
    )
    rooms = [public, knock]
    membership: dict[str, str | None] = {public: None, knock: None}
    before: dict[str, str | None] = dict(membership)
    names: dict[str, str | None] = {public: "start", knock: "start"}
    visibility = {public: "shared", knock: "shared"}
    since = (await me.sync("p1"))["next_batch"]
    steps = data.draw(st.integers(4, 16), label="steps")
    for n in range(steps):
        room = data.draw(st.sampled_from(rooms), label="room")
        moves = [
            (who, what) for who, what in MOVES[membership[room]] + ALWAYS
            if not (what == "join" and room == knock) and not (what == "knock" and room == public)
        ]  # fmt: skip
        who, what = data.draw(st.sampled_from(moves), label="move")
        if what == "sync" or n == steps - 1:
            body = await me.sync("p1", since, 0)
            window = await _window(pool, rooms, since, body["next_batch"])
            expected = model(user, before, window, names, visibility)
            got = actual(body)
            assert {r: v for r, v in got.join.items() if r in rooms} == expected.join
            assert {r: v for r, v in got.leave.items() if r in rooms} == expected.leave
            assert got.pending == expected.pending
            since = body["next_batch"]
            continue
        await _move(owner, me, room, who, what, n)
        if what not in ("send", "rename", "visibility"):
            membership[room] = {"kick": "leave", "unban": "leave"}.get(what, what)
    initial = await me.sync("p1")
    for room in rooms:
        state = membership[room]
        for kind in PENDING:
            listed = initial["rooms"][kind].get(room)
            assert (listed is not None) == (state == kind)
            if listed is not None:
                event = listed[f"{kind}_state"]["events"][-1]
                assert event["state_key"] == user and event["content"]["membership"] == kind
        assert (room in initial["rooms"]["join"]) == (state == "join")
