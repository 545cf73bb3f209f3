"""The claim statement under real concurrency: many connections of two pools (as two workers)
claim one device's keys at once; each one-time key goes out exactly once, and no claim falls back
while a one-time key is left."""

from __future__ import annotations

import asyncio

import asyncpg

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
