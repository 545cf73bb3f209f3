"""The load's racing membership changes (`workers.harness.membership_races` holds the pairs, the
rules and the check): a pair of changes to one user, sent at the same time through two different
workers, as a client and a room's admin do when their clicks cross.

The caller holds the target's lock (the load serializes a user's membership changes) and gives
its known membership; the racer reports the membership the room stored after the race, read from
the events table (None: unknown, a side's outcome or the read failed), and keeps every outcome
for the check at the end of the run.
"""

from __future__ import annotations

import asyncio
import random

import aiohttp
import asyncpg

from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.harness.membership_races import (
    PAIRS,
    Move,
    RaceOutcome,
    RaceTally,
    check_races,
    foreign,
    prepare,
)

#: The largest head start of the first side of a pair: both land in the same persister batch.
SPREAD_S = 0.004


class MembershipRacer:
    """Sends racing pairs; `outcomes` and `tally` hold what came of them."""

    def __init__(self, database_url: str, rng: random.Random) -> None:
        self.database_url = database_url
        self.rng = rng
        self.outcomes: list[RaceOutcome] = []
        self.tally = RaceTally()
        #: Changes made to reach a race's start: (the moves made, each stored) counted by the caller.
        self.prepared = 0
        #: Opened at the first race: a connection per look-up cost the machine a backend per race.
        self._pool: asyncpg.Pool | None = None

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def _member_events(
        self, room: str, user: str, after: int | None
    ) -> list[tuple[int, str, str, str]]:
        """(stream ordering, event id, membership, sender) of `user`'s member events in `room` after
        `after` (None: only the last one), oldest first."""
        if self._pool is None:
            self._pool = await asyncpg.create_pool(self.database_url, min_size=0, max_size=2)
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT stream_ordering, event_id, json::jsonb->'content'->>'membership' AS membership,"
                " sender FROM events WHERE room_id = $1 AND type = 'm.room.member' AND state_key = $2"
                " AND stream_ordering > coalesce($3::bigint, -9223372036854775808)"
                " ORDER BY stream_ordering DESC LIMIT CASE WHEN $3::bigint IS NULL THEN 1 END",
                room, user, after,
            )  # fmt: skip
        return [(r["stream_ordering"], r["event_id"], r["membership"], r["sender"]) for r in reversed(rows)]

    def _workers(self, client: ClusterClient) -> tuple[str | None, str | None]:
        """Two different workers of those the client may reach (a load balancer's when it has
        one); the same one twice, or none named, when it may reach only one."""
        names = list(client.balanced if client.balanced is not None else client.urls)
        if len(names) < 2:
            return None, None
        first, second = self.rng.sample(names, 2)
        return first, second

    async def race(
        self, owner: ClusterClient, target: ClusterClient, room: str, membership: str | None
    ) -> tuple[int, str | None]:
        """Prepare and run one pair on `target` in the public `room` whose creator is `owner`;
        (events written, the target's membership after it, None when unknown). Raises what a
        preparing change raises (the caller's usual handling: 403 counted, a fault makes the
        membership unknown)."""

        async def do(move: Move, via: str | None) -> Move:
            who, what = move
            if who == "me":
                await target.membership(room, what, via=via)
            else:
                op = "leave" if what == "kick" else what
                await owner.membership(room, op, target=str(target.user_id), via=via)
            return move

        pair = self.rng.choice([p for p in PAIRS if p.start == membership] or PAIRS)
        written = 0
        for move in prepare(membership, pair.start):
            await do(move, None)
            written += 1
        self.prepared += written
        moves = [pair.mine, pair.owners]
        self.rng.shuffle(moves)
        first_via, second_via = self._workers(target)
        delay = self.rng.uniform(0, SPREAD_S)
        user, owner_id = str(target.user_id), str(owner.user_id)
        try:
            before = await self._member_events(room, user, None)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            return written, None  # a fault scenario took the database: no race this time

        async def second() -> Move:
            await asyncio.sleep(delay)
            return await do(moves[1], second_via)

        answers = await asyncio.gather(do(moves[0], first_via), second(), return_exceptions=True)
        accepted: list[Move] = []
        refused: list[Move] = []
        for move, answer in zip(moves, answers, strict=True):
            if not isinstance(answer, BaseException):
                accepted.append(move)
            elif isinstance(answer, RequestRefused) and answer.status == 403:
                refused.append(move)
            elif isinstance(answer, RequestRefused) and answer.status < 500:
                raise answer
            elif isinstance(answer, (RequestRefused, aiohttp.ClientError, TimeoutError)):
                self.tally.unknown += 1  # a fault: the room decided, nobody told us what
                return written, None
            else:
                raise answer
        try:
            rows = await self._member_events(room, user, before[-1][0] if before else None)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            self.tally.count(accepted, refused)
            return written + len(accepted), None
        # The membership API answers no event id: each stored change is told apart by its
        # membership and sender, which differ between the two sides of every pair.
        moves = [_move(m, sender, user, owner_id) for _, _, m, sender in rows]
        if foreign(moves, accepted, refused):
            self.tally.unknown += 1
            return written + len(rows), None
        self.tally.count(accepted, refused)
        stored = {move: (e, o) for move, (o, e, _, _) in zip(moves, rows, strict=True)}
        # Judged from the membership stored before the race, not the one the load meant to set
        # up: after a fault the load's idea of it may be wrong (a change committed, answered 5xx).
        start = before[-1][2] if before else "leave"
        start_by = _move(start, before[-1][3], user, owner_id)[0] if before else None
        outcome = RaceOutcome(
            pair.name, room, user, start,
            tuple((m, *stored.get(m, ("", None))) for m in accepted), tuple(refused),
            tuple(m for m in refused if m in stored), start_by,
        )  # fmt: skip
        self.outcomes.append(outcome)
        return written + len(outcome.stored_order()), outcome.final()  # a repeat stored nothing

    def check(self) -> list[str]:
        """Every race whose stored result the rules do not allow."""
        return check_races(self.outcomes)


def _move(membership: str, sender: str, user: str, owner: str) -> Move:
    if sender == user:
        return ("me", membership)
    return ("owner", "kick" if membership == "leave" else membership)
