"""A room's events are authorized in the room's order, on real persisters and workers: racing
membership changes, power-level changes and sends, sent to different workers at once, never leave
a stored event that the Matrix authorization rules refuse. Two judges replay the rooms' stored
events: the rules as the harness writes them from the spec (`workers.harness.auth_rules`) and
Synapse's own `synapse.event_auth`, run in Synapse's virtualenv (`judge_with_synapse`)."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import Awaitable
from typing import Any

import aiohttp
import asyncpg

from tests.cluster.conftest import MakeCluster
from workers.harness.auth_replay import judge_with_built_synapse, replay_database
from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.routing import writer_for_room

WORKERS = ("persister1", "persister2", "sync1", "sync2")


async def _outcome(call: Awaitable[Any]) -> str:
    """ "ok", or the refusal's status and errcode (`403 M_FORBIDDEN`)."""
    try:
        await call
    except RequestRefused as e:
        return f"{e.status} {e.errcode}"
    return "ok"


async def _judged(database_url: str, rooms: list[str], why: object) -> int:
    """Both judges refuse none of the rooms' stored events: the spec's rules and Synapse's
    `event_auth` (which judges every room); the events replayed."""
    result = await replay_database(database_url, rooms)
    assert not result.violations, (why, [str(v) for v in result.violations])
    verdict = await judge_with_built_synapse(database_url, rooms)
    assert verdict.rooms == len(rooms) and not verdict.refused, (why, str(verdict))
    return result.events


async def _memberships(database_url: str, user: str) -> dict[str, tuple[str, int]]:
    """room -> (`user`'s current membership, the stream ordering of that event)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT room_id, membership, event_stream_ordering FROM current_state_events"
            " WHERE type = 'm.room.member' AND state_key = $1",
            user,
        )
    finally:
        await conn.close()
    return {r["room_id"]: (r["membership"], r["event_stream_ordering"]) for r in rows}


async def test_a_join_racing_a_reinvite_leaves_the_user_joined(
    make_cluster: MakeCluster, database_url: str
) -> None:
    """The reported race: an invited user joins through one worker (the room's persister) while
    the room's creator invites them again through another (a sync worker, which forwards it a
    moment later), in many rooms at once. Either order is valid (an invite
    of an invitee is allowed, then the join), but an invite stored after the join is not: the
    user would end up invited in a room it joined."""
    cluster = await make_cluster(persisters=2, sync_workers=2, background_workers=0)
    async with aiohttp.ClientSession() as session:
        alice, bob = ClusterClient(session, cluster.urls), ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        await bob.register("bob", via="sync2")
        bob_id = str(bob.user_id)
        rooms = list(
            await asyncio.gather(
                *(alice.create_room("invite", via=WORKERS[i % 4], invite=[bob_id]) for i in range(40))
            )
        )
        pairs = await asyncio.gather(
            *(
                asyncio.gather(
                    _outcome(bob.membership(room, "join", via=writer_for_room(room, cluster.event_writers))),
                    _outcome(alice.membership(room, "invite", bob_id, via="sync2")),
                )
                for room in rooms
            )
        )
    assert all(join == "ok" for join, _ in pairs), pairs  # the join is valid in either order
    assert {invite for _, invite in pairs} <= {"ok", "403 M_FORBIDDEN"}, pairs
    memberships = await _memberships(database_url, bob_id)
    invited_after_joining = [room for room in rooms if memberships[room][0] != "join"]
    assert not invited_after_joining, (len(invited_after_joining), Counter(i for _, i in pairs))
    assert await _judged(database_url, rooms, "join racing a re-invite") > 40 * 5


async def test_a_restricted_join_racing_its_authorisers_leave_or_demotion(
    make_cluster: MakeCluster, database_url: str
) -> None:
    """A member of a space joins a room the space's members may join (join rule `restricted`),
    vouched for by the room's one admin, while the admin leaves the room or drops below the invite
    level, through two workers at once, in many rooms. Either order may be stored, but a join
    stored after its authoriser left or lost the invite level is one the rules refuse: the writer
    must check the join against the state its previous event left, the authoriser's membership
    included, and refuse it (403) when the authoriser is gone."""
    cluster = await make_cluster(persisters=2, sync_workers=2, background_workers=0)
    async with aiohttp.ClientSession() as session:
        alice, bob = ClusterClient(session, cluster.urls), ClusterClient(session, cluster.urls)
        await alice.register("alice", via="sync1")
        await bob.register("bob", via="sync2")
        alice_id = str(alice.user_id)
        space = await alice.create_room("public", via="sync1")
        await bob.membership(space, "join", via="sync2")
        allow = [{"type": "m.room_membership", "room_id": space}]
        rules = {
            "type": "m.room.join_rules",
            "state_key": "",
            "content": {"join_rule": "restricted", "allow": allow},
        }
        levels = {"users": {alice_id: 100}, "invite": 50}
        rooms = list(
            await asyncio.gather(
                *(alice.create_room("invite", via=WORKERS[i % 4], initial_state=[rules],
                                    power_level_content_override=levels) for i in range(40))
            )
        )  # fmt: skip
        demoted = {**levels, "users": {alice_id: 10}}

        rng = random.Random(40)

        async def step_aside(i: int, room: str) -> Any:
            await asyncio.sleep(rng.uniform(0, 0.15))  # the join reads before it sends: both orders
            via = writer_for_room(room, cluster.event_writers) if i % 2 else "sync1"
            if i % 4 < 2:
                return await alice.membership(room, "leave", via=via)
            return await alice.set_state(room, "m.room.power_levels", "", demoted, via=via)

        pairs = await asyncio.gather(
            *(
                asyncio.gather(
                    _outcome(bob.membership(room, "join", via="sync2" if i % 2 else WORKERS[i % 2])),
                    _outcome(step_aside(i, room)),
                )
                for i, room in enumerate(rooms)
            )
        )
    assert all(aside == "ok" for _, aside in pairs), pairs  # valid in either order
    joins = Counter(join for join, _ in pairs)
    assert set(joins) <= {"ok", "403 M_FORBIDDEN", "400 M_UNABLE_TO_GRANT_JOIN"}, joins
    assert joins["ok"] > 0, joins
    await _judged(database_url, [space, *rooms], ("restricted join racing its authoriser", joins))


async def test_a_kick_racing_a_ban_never_lifts_it(make_cluster: MakeCluster, database_url: str) -> None:
    """A moderator kicks a member while the owner bans them, through two workers at once, in many
    rooms. Both orders are valid for the rules (a kick of a banned user is an unban to them), but a
    /kick that lands after the ban must be refused, as Synapse refuses it: the member stays banned."""
    cluster = await make_cluster(persisters=2, sync_workers=2, background_workers=0)
    async with aiohttp.ClientSession() as session:
        alice, bob, carol = (ClusterClient(session, cluster.urls) for _ in range(3))
        await alice.register("alice", via="sync1")
        await bob.register("bob", via="sync2")
        await carol.register("carol", via="sync1")
        bob_id, carol_id = str(bob.user_id), str(carol.user_id)
        power = {"users": {str(alice.user_id): 100, carol_id: 50}}
        rooms = list(
            await asyncio.gather(
                *(alice.create_room("public", via=WORKERS[i % 4], power_level_content_override=power)
                  for i in range(40))
            )
        )  # fmt: skip
        for i, room in enumerate(rooms):
            await bob.membership(room, "join", via=WORKERS[i % 4])
            await carol.membership(room, "join", via=WORKERS[(i + 1) % 4])
        # Half the rooms get the ban straight at the room's writer and the kick through a sync
        # worker (forwarded), half the other way round, so both orders are stored.
        vias = [(writer_for_room(room, cluster.event_writers), "sync2") for room in rooms]
        pairs = await asyncio.gather(
            *(
                asyncio.gather(
                    _outcome(alice.membership(room, "ban", bob_id, via=vias[i][i % 2])),
                    _outcome(carol.membership(room, "leave", bob_id, via=vias[i][1 - i % 2])),
                )
                for i, room in enumerate(rooms)
            )
        )
    assert all(ban == "ok" for ban, _ in pairs), pairs  # a ban is valid in either order
    assert {kick for _, kick in pairs} <= {"ok", "403 M_BAD_STATE"}, pairs  # a banned user kicked
    memberships = await _memberships(database_url, bob_id)
    unbanned = [room for room in rooms if memberships[room][0] != "ban"]
    assert not unbanned, (len(unbanned), Counter(k for _, k in pairs))
    await _judged(database_url, rooms, "kick racing a ban")


async def test_racing_room_changes_store_only_what_the_rules_allow(
    make_cluster: MakeCluster, database_url: str
) -> None:
    """A bounded random driver: each step takes a room and a target user and sends, at once and
    through different workers, membership changes of that target from several members (join,
    knock, invite, leave, kick, ban, unban), a power-level change by the owner or by a member below
    every level it may add or remove (carol, at 40, may send power levels: the default 50s it adds
    or drops as keys are changes the rules judge), a join-rule change (to any of the five, the
    restricted ones allowing another of the rooms, whose members join vouched for), a redaction of
    an earlier rule change, a join naming an authorising user (of this server or of another, which
    never signed it: the API drops the key, as Synapse does) and messages; every answer is 200 or a
    403. Two of the three rooms begin as `knock` and `knock_restricted` (allowing the first), so
    knocks and vouched joins are stored among the races; those two are of room version 11, whose
    redaction of power levels keeps `invite` (10's drops it). Then every room's stored events are
    replayed through both judges."""
    seed = int(os.environ.get("FANOUT_AUTH_SEED", random.randrange(1 << 32)))
    rng = random.Random(seed)
    cluster = await make_cluster(persisters=2, sync_workers=2, background_workers=0)
    outcomes: Counter[str] = Counter()
    async with aiohttp.ClientSession() as session:
        names = ("alice", "bob", "carol", "dave")
        users = {n: ClusterClient(session, cluster.urls) for n in names}
        for name, client in users.items():
            await client.register(name, via=rng.choice(WORKERS))
        ids = {n: str(c.user_id) for n, c in users.items()}
        levels = {ids["alice"]: 100, ids["bob"]: 50, ids["carol"]: 40}
        power = {"users": levels, "ban": 50, "kick": 50, "invite": 0, "events": {"m.room.power_levels": 40}}
        rooms = [
            await users["alice"].create_room(
                "public", via=w, power_level_content_override=power, room_version=version
            )
            for w, version in (("persister1", "10"), ("persister2", "11"), ("sync1", "11"))
        ]
        for room in rooms:
            for name in names[1:]:
                await users[name].membership(room, "join", via=rng.choice(WORKERS))
        allow = [{"type": "m.room_membership", "room_id": rooms[0]}]
        knocking: list[dict[str, Any]] = [
            {"join_rule": "knock"},
            {"join_rule": "knock_restricted", "allow": allow},
        ]
        for room, rule in zip(rooms[1:], knocking, strict=True):
            await users["alice"].set_state(room, "m.room.join_rules", "", rule, via=rng.choice(WORKERS))

        rule_events: dict[str, list[str]] = {room: [] for room in rooms}

        async def set_rule(
            by: ClusterClient, room: str, kind: str, content: dict[str, Any], via: str
        ) -> None:
            """A rule change, whose event a later step may redact (a redacted power levels event
            counts as its pruned content from then on)."""
            rule_events[room].append((await by.set_state(room, kind, "", content, via=via))["event_id"])

        def step(room: str) -> list[Awaitable[Any]]:
            target = rng.choice(names[1:])
            actor = lambda: users[rng.choice(names)]  # noqa: E731
            via = lambda: rng.choice(WORKERS)  # noqa: E731
            me = users[target]
            moves: list[Awaitable[Any]] = [
                me.membership(room, rng.choice(["join", "leave", "knock"]), via=via()),
                actor().membership(room, "invite", ids[target], via=via()),
                actor().membership(room, rng.choice(["leave", "ban"]), ids[target], via=via()),
                actor().membership(
                    room, rng.choice(["leave", "unban"]), ids[target], via=via()
                ),  # kick, unban
                me.send(room, "m.room.message", {"body": "racing"}, via=via()),
                me.send(room, "m.room.message", {"body": "racing"}, via=via()),
            ]
            if rng.random() < 0.5:
                new = {ids["alice"]: 100, ids[target]: rng.choice([0, 50, 60])}
                content = {**power, "users": new, "kick": rng.choice([50, 60])}
                moves.append(set_rule(users["alice"], room, "m.room.power_levels", content, via()))
            if rng.random() < 0.5:
                content = dict(power)
                if rng.random() < 0.3:
                    content["notifications"] = {"room": rng.choice([40, 50])}
                key = rng.choice(
                    ["redact", "state_default", "ban", "kick", "users_default", "events_default", "invite"]
                )
                if rng.random() < 0.5:
                    content.pop(key, None)
                else:
                    content[key] = rng.choice([0, 40, 50])
                by = users[rng.choice(["bob", "carol"])]
                moves.append(set_rule(by, room, "m.room.power_levels", content, via()))
            if rng.random() < 0.3:
                rule = rng.choice(["public", "invite", "knock", "restricted", "knock_restricted"])
                content = {"join_rule": rule}
                if rule.endswith("restricted"):
                    allowed = rng.choice([r for r in rooms if r != room])
                    content["allow"] = [{"type": "m.room_membership", "room_id": allowed}]
                moves.append(set_rule(actor(), room, "m.room.join_rules", content, via()))
            if rng.random() < 0.3:  # a join naming an authorising user: stored without it, whoever it names
                authoriser = rng.choice([ids["alice"], "@admin:elsewhere.example"])
                content = {"membership": "join", "join_authorised_via_users_server": authoriser}
                moves.append(me.set_state(room, "m.room.member", ids[target], content, via=via()))
            if rule_events[room] and rng.random() < 0.4:
                moves.append(actor().redact(room, rng.choice(rule_events[room]), via=via()))
            rng.shuffle(moves)
            return moves

        for _ in range(14):
            moves = [m for room in rng.sample(rooms, 2) for m in step(room)]
            outcomes.update(await asyncio.gather(*(_outcome(m) for m in moves)))
    assert set(outcomes) <= {"ok", "403 M_FORBIDDEN", "403 M_BAD_STATE"}, (seed, outcomes)
    assert outcomes["ok"] > 50, (seed, outcomes)
    await _judged(database_url, rooms, (seed, outcomes))
