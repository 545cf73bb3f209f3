"""Which workers count as the previous release's: a name held with a session advisory lock (how
0.1.0 holds it), not a lease row of this release, nor a row left by a worker that died, nor a
name under another channel prefix."""

from __future__ import annotations

import asyncpg

from tests.compat.previous_worker import previous_release_worker
from workers.process.instance_lease import InstanceLease
from workers.process.previous_release import PreviousRelease
from workers.storage import create_pool


async def test_only_a_name_held_by_an_advisory_lock_is_the_previous_release(
    database_url: str, channel_prefix: str
) -> None:
    pool = await create_pool(database_url, 2)
    try:
        previous = PreviousRelease(pool, f"{channel_prefix}/")
        lease = await InstanceLease.acquire(database_url, channel_prefix, "head1", 5.0, lambda: None)
        try:
            assert not await previous.check()  # a worker of this release: a lease row
            async with previous_release_worker(database_url, f"other-{channel_prefix}/old1"):
                assert not await previous.check()  # another cluster's
            async with previous_release_worker(database_url, f"{channel_prefix}/old1"):
                assert await previous.check()
                assert previous.hashed_writer("!r:hs", ["p1", "p2"]) in ("p1", "p2")
            # The old worker's session ended; its row stays (as after a crash) and counts no more.
            conn = await asyncpg.connect(database_url)
            try:
                assert (
                    await conn.fetchval(
                        "SELECT count(*) FROM instance_leases WHERE lease_key = $1", f"{channel_prefix}/old1"
                    )
                    == 1
                )
            finally:
                await conn.close()
            assert not await previous.check()
            assert previous.hashed_writer("!r:hs", ["p1", "p2"]) is None
        finally:
            await lease.release()
    finally:
        await pool.close()
