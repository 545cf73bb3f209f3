"""The claim statement under real concurrency: many connections of two pools (as two workers)
claim one device's keys at once; each one-time key goes out exactly once, and no claim falls back
while a one-time key is left. And under the plan statistics of a nearly empty table: one claim,
one key."""

from __future__ import annotations

import asyncio

import asyncpg

from workers.storage import events as events_store
from workers.storage import one_time_keys as store
from workers.storage.one_time_keys import UploadedKey

USER, DEVICE, ALG = "@bob:localhost", "PHONE", "signed_curve25519"


async def test_concurrent_claims_on_two_pools_hand_out_each_key_once(database_url: str) -> None:
    pools = [await asyncpg.create_pool(database_url, min_size=8, max_size=8) for _ in range(2)]
    try:
        async with pools[0].acquire() as conn:
            await conn.execute("INSERT INTO users (user_id, created_ts) VALUES ($1, 0)", USER)
            await conn.execute(
                "INSERT INTO devices (user_id, device_id, created_ts) VALUES ($1, $2, 0)", USER, DEVICE
            )
            keys = [UploadedKey(ALG, f"K{n:04d}", f'"k{n}"') for n in range(400)]
            await store.add_one_time_keys(conn, USER, DEVICE, keys, 0)
            await store.set_fallback_keys(conn, USER, DEVICE, [UploadedKey(ALG, "F", '"f"')])

        async def claimer(pool: asyncpg.Pool, rounds: int) -> list[str]:
            handed: list[str] = []
            async with pool.acquire() as conn:
                for _ in range(rounds):
                    claimed = await store.claim_keys(conn, [(USER, DEVICE, ALG)])
                    handed += [c.key.key_id for c in claimed]
            return handed

        results = await asyncio.gather(*(claimer(pools[n % 2], 30) for n in range(16)))
        handed = [key_id for result in results for key_id in result]
        assert len(handed) == 16 * 30
        assert sorted(k for k in handed if k != "F") == [k.key_id for k in keys]
        assert handed.count("F") == 16 * 30 - len(keys)
        async with pools[1].acquire() as conn:
            assert await store.key_counts(conn, USER, DEVICE) == ({ALG: 0}, [])
    finally:
        for pool in pools:
            await pool.close()


async def test_counts_read_beside_event_bodies_are_the_counts_read_alone(db_pool: asyncpg.Pool) -> None:
    """`events.events_with_key_counts` carries `key_counts_of` in the bodies' statement: the same
    counts, also when no event asked for is stored (the counts come on the one row left)."""
    async with db_pool.acquire() as conn:
        await conn.execute("INSERT INTO users (user_id, created_ts) VALUES ($1, 0)", USER)
        for device in (DEVICE, "LAPTOP"):
            await conn.execute(
                "INSERT INTO devices (user_id, device_id, created_ts) VALUES ($1, $2, 0)", USER, device
            )
        await store.add_one_time_keys(
            conn, USER, DEVICE, [UploadedKey(ALG, f"K{n}", '"k"') for n in range(3)], 0
        )
        await store.add_one_time_keys(conn, USER, DEVICE, [UploadedKey("other", "O", '"o"')], 0)
        await store.set_fallback_keys(conn, USER, "LAPTOP", [UploadedKey(ALG, "F", '"f"')])
        devices = [(USER, DEVICE), (USER, "LAPTOP"), ("@nobody:localhost", "X")]
        alone = await store.key_counts_of(conn, devices)
        events, beside = await events_store.events_with_key_counts(conn, ["$not-stored"], devices)
    assert events == {}
    assert beside == alone
    assert alone[(USER, DEVICE)] == ({ALG: 3, "other": 1}, [])
    assert alone[(USER, "LAPTOP")] == ({ALG: 0}, [ALG])


async def test_a_claim_takes_one_key_when_the_statistics_saw_an_almost_empty_table(
    db_pool: asyncpg.Pool,
) -> None:
    """One claim takes one key whatever plan PostgreSQL picks. With statistics from a table of one
    key (a new or just restored database), the planner scanned the keys and ran the key pick inside
    the DELETE again for each one, every run skipping the keys the runs before had locked: one
    claim deleted all of the device's keys and the answer handed out only one."""
    async with db_pool.acquire() as conn:
        await conn.execute("INSERT INTO users (user_id, created_ts) VALUES ($1, 0)", USER)
        for device in (DEVICE, "OTHER"):
            await conn.execute(
                "INSERT INTO devices (user_id, device_id, created_ts) VALUES ($1, $2, 0)", USER, device
            )
        await store.add_one_time_keys(conn, USER, "OTHER", [UploadedKey(ALG, "O", '"o"')], 0)
        await conn.execute("ANALYZE e2e_one_time_keys")
        await store.add_one_time_keys(
            conn, USER, DEVICE, [UploadedKey(ALG, f"K{n}", f'"k{n}"') for n in range(3)], 0
        )
        claimed = await store.claim_keys(conn, [(USER, DEVICE, ALG)])
        assert [c.key.key_id for c in claimed] == ["K0"]
        assert await store.key_counts(conn, USER, DEVICE) == ({ALG: 2}, [])
