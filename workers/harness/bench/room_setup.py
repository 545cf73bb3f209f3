"""Users and rooms for the long-poll benchmarks, made through the client API as clients make them.

`populate` registers, per room, a creator (the room's sender) and `members - 1` users who join it,
plus `idle_users` users in no room; then takes each user's current `next_batch` (a `/sync` with
`timeout=0`) once every join is done, so that no later poll wakes for someone else's join.
Registration hashes a password (argon2id) per user: at most `PARALLEL` requests run at once.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from urllib.parse import quote

import aiohttp

from workers.harness.bench._common import progress
from workers.harness.bench.poll_clients import CLIENT

PARALLEL = 32
NO_TIMELINE = quote('{"room":{"timeline":{"limit":0}}}')


@dataclass
class User:
    token: str
    since: str = ""


@dataclass
class Room:
    room_id: str
    sender: User
    #: The members who joined (the creator, `sender`, is not among them).
    joined: list[User] = field(default_factory=list)


async def register(http: aiohttp.ClientSession, base: str, name: str) -> str:
    """Register `name` (m.login.dummy) and return its access token."""
    body = {"username": name, "password": uuid.uuid4().hex, "auth": {"type": "m.login.dummy"}}
    async with http.post(f"{base}{CLIENT}/register", json=body) as resp:
        resp.raise_for_status()
        return str((await resp.json())["access_token"])


async def populate(base: str, rooms: int, members: int, idle_users: int = 0) -> tuple[list[Room], list[User]]:
    """`rooms` public rooms of `members` users each and `idle_users` users in none, through `base`."""
    tag = uuid.uuid4().hex[:6]
    limit = asyncio.Semaphore(PARALLEL)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * PARALLEL)) as http:

        async def user(name: str) -> User:
            async with limit:
                return User(await register(http, base, name))

        async def room(index: int) -> Room:
            creator = await user(f"c{index}x{tag}")
            async with (
                limit,
                http.post(
                    f"{base}{CLIENT}/createRoom",
                    json={"preset": "public_chat"},
                    headers={"Authorization": f"Bearer {creator.token}"},
                ) as r,
            ):
                r.raise_for_status()
                made = Room(str((await r.json())["room_id"]), creator)
            made.joined = await asyncio.gather(
                *(join(made.room_id, f"m{index}x{i}x{tag}") for i in range(members - 1))
            )
            return made

        async def join(room_id: str, name: str) -> User:
            joiner = await user(name)
            async with (
                limit,
                http.post(
                    f"{base}{CLIENT}/join/{quote(room_id, safe='')}",
                    json={},
                    headers={"Authorization": f"Bearer {joiner.token}"},
                ) as r,
            ):
                r.raise_for_status()
            return joiner

        async def latest(one: User) -> None:
            async with (
                limit,
                http.get(
                    f"{base}{CLIENT}/sync?timeout=0&filter={NO_TIMELINE}",
                    headers={"Authorization": f"Bearer {one.token}"},
                ) as r,
            ):
                r.raise_for_status()
                one.since = str((await r.json())["next_batch"])

        progress(f"  registering {rooms * members:,} users in {rooms:,} rooms and {idle_users:,} in none ...")
        made = await asyncio.gather(*(room(i) for i in range(rooms)))
        idle = await asyncio.gather(*(user(f"i{i}x{tag}") for i in range(idle_users)))
        everyone = [u for r in made for u in (r.sender, *r.joined)] + list(idle)
        await asyncio.gather(*(latest(u) for u in everyone))
    return list(made), list(idle)
