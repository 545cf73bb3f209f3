"""`CountReads` on a real PostgreSQL: the reads of one turn share a statement, a read asked for
ahead is taken only by an answer whose request started before it was asked for, and such an
answer still tells a claim committed before its request began."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from workers.handlers.stored.one_time_keys import AHEAD_KEEP_NS, CountReads
from workers.storage import one_time_keys as store
from workers.storage.one_time_keys import UploadedKey

USER, ALG = "@bob:localhost", "signed_curve25519"


async def _devices(pool: asyncpg.Pool, *devices: str) -> None:
    async with pool.acquire() as conn:
        await conn.execute("INSERT INTO users (user_id, created_ts) VALUES ($1, 0)", USER)
        for device in devices:
            await conn.execute(
                "INSERT INTO devices (user_id, device_id, created_ts) VALUES ($1, $2, 0)", USER, device
            )
            keys = [UploadedKey(ALG, f"K{n}", f'"k{n}"') for n in range(3)]
            await store.add_one_time_keys(conn, USER, device, keys, 0)


async def _claim(pool: asyncpg.Pool, device: str) -> None:
    async with pool.acquire() as conn:
        assert len(await store.claim_keys(conn, [(USER, device, ALG)])) == 1


async def test_an_answer_takes_a_read_asked_for_ahead_after_its_request_began(db_pool: asyncpg.Pool) -> None:
    await _devices(db_pool, "PHONE", "LAPTOP")
    reads = CountReads(db_pool)
    started = time.monotonic_ns()
    reads.ahead([(USER, "PHONE"), (USER, "LAPTOP")])
    assert reads.statements == 0  # sent at the end of the turn, once for both
    await asyncio.sleep(0)
    assert reads.statements == 1
    phone = await reads.read(USER, "PHONE", started)
    laptop = await reads.read(USER, "LAPTOP", started)
    assert phone.one_time == laptop.one_time == {ALG: 3}
    assert (reads.statements, reads.taken_ahead) == (1, 2)
    # Taken once: the next answer reads again.
    assert (await reads.read(USER, "PHONE", started)).one_time == {ALG: 3}
    assert (reads.statements, reads.taken_ahead) == (2, 2)


async def test_a_read_asked_for_before_the_request_started_is_not_taken(db_pool: asyncpg.Pool) -> None:
    """The read ahead may predate a claim the asker was told of before it asked: it reads again."""
    await _devices(db_pool, "PHONE")
    reads = CountReads(db_pool)
    reads.ahead([(USER, "PHONE")])
    await asyncio.sleep(0.01)  # the statement ran before the claim
    await _claim(db_pool, "PHONE")
    started = time.monotonic_ns()
    counts = await reads.read(USER, "PHONE", started)
    assert counts.one_time == {ALG: 2}
    assert (reads.statements, reads.taken_ahead) == (2, 0)


async def test_a_read_without_a_start_never_takes_one_asked_for_ahead(db_pool: asyncpg.Pool) -> None:
    await _devices(db_pool, "PHONE")
    reads = CountReads(db_pool)
    reads.ahead([(USER, "PHONE")])
    await asyncio.sleep(0.01)
    await _claim(db_pool, "PHONE")
    assert (await reads.read(USER, "PHONE")).one_time == {ALG: 2}
    assert reads.taken_ahead == 0


async def test_reads_asked_for_ahead_and_never_taken_are_dropped(db_pool: asyncpg.Pool) -> None:
    await _devices(db_pool, "PHONE", "LAPTOP")
    reads = CountReads(db_pool)
    reads.ahead([(USER, "PHONE")])
    await asyncio.sleep(0.01)
    (_, future) = reads._ahead[(USER, "PHONE")]
    reads._ahead[(USER, "PHONE")] = (time.monotonic_ns() - AHEAD_KEEP_NS - 1, future)
    reads.ahead([(USER, "LAPTOP")])
    assert list(reads._ahead) == [(USER, "LAPTOP")]
    await asyncio.sleep(0.01)


async def test_reads_that_ride_get_their_counts_from_the_statement_that_carries_them(
    db_pool: asyncpg.Pool,
) -> None:
    """`ride` takes the turn's reads (the ones asked for ahead and any other not yet sent) out of
    the turn's own statement; the carrying statement answers each, and an answer that started
    before takes the read asked for ahead."""
    await _devices(db_pool, "PHONE", "LAPTOP")
    reads = CountReads(db_pool)
    started = time.monotonic_ns()
    other = reads.read(USER, "LAPTOP")
    turn = reads.ride([(USER, "PHONE")])
    assert turn is not None
    asked = []

    async def carry(devices: list[tuple[str, str]]) -> tuple[str, store.KeyCountsOf]:
        asked.append(sorted(devices))
        async with db_pool.acquire() as conn:
            return "mine", await store.key_counts_of(conn, devices)

    assert await turn.riding(carry) == "mine"
    assert asked == [[(USER, "LAPTOP"), (USER, "PHONE")]]
    assert (await other).one_time == {ALG: 3}
    assert (await reads.read(USER, "PHONE", started)).one_time == {ALG: 3}
    await asyncio.sleep(0.01)
    assert (reads.statements, reads.rode, reads.taken_ahead) == (0, 1, 1)


async def test_a_failed_carrying_statement_fails_each_read_it_carried(db_pool: asyncpg.Pool) -> None:
    reads = CountReads(db_pool)
    turn = reads.ride([(USER, "PHONE")])
    assert turn is not None
    waiting = reads.read(USER, "PHONE", 1)

    async def fail(devices: list[tuple[str, str]]) -> tuple[None, store.KeyCountsOf]:
        raise ConnectionError("the database went away")

    try:
        await turn.riding(fail)
    except ConnectionError:
        pass
    else:
        raise AssertionError("the carrying statement's error was swallowed")
    try:
        await waiting
    except ConnectionError as e:
        assert "went away" in str(e)
    else:
        raise AssertionError("a carried read was answered without a statement")


async def test_a_turn_not_carried_is_sent_alone(db_pool: asyncpg.Pool) -> None:
    await _devices(db_pool, "PHONE")
    reads = CountReads(db_pool)
    started = time.monotonic_ns()
    turn = reads.ride([(USER, "PHONE")])
    assert turn is not None and reads.ride([]) is None
    turn.send()
    assert (await reads.read(USER, "PHONE", started)).one_time == {ALG: 3}
    await asyncio.sleep(0.01)
    assert (reads.statements, reads.rode) == (1, 0)


async def test_a_cancelled_carrying_statement_hands_its_reads_back(db_pool: asyncpg.Pool) -> None:
    """The line that carried the reads was cancelled, not the askers: their reads go alone."""
    await _devices(db_pool, "PHONE")
    reads = CountReads(db_pool)
    waiting = reads.read(USER, "PHONE")
    turn = reads.ride([])
    assert turn is not None

    async def never(devices: list[tuple[str, str]]) -> tuple[None, store.KeyCountsOf]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    carrier = asyncio.create_task(turn.riding(never))
    await asyncio.sleep(0.01)
    carrier.cancel()
    try:
        await carrier
    except asyncio.CancelledError:
        pass
    assert (await asyncio.wait_for(waiting, 5)).one_time == {ALG: 3}
    assert (reads.statements, reads.rode) == (1, 1)
