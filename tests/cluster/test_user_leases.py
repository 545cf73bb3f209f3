"""A user's stored-stream writes with real persisters: the writer of a user's account data and
to-device sends stops (SIGTERM) or dies (SIGKILL) while the user's writes arrive at a sync worker:
the user's leases move to the other writer (at once on a planned stop; once the dead one's instance
lease expired after a crash), the writes wait for that and succeed (no 5xx), and the recipient gets
the user's to-device messages in the order sent. A frozen writer whose user moved cannot commit
its pending write."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.cluster.conftest import MakeCluster
from tests.workers.worker_process import until_blocked_on_lock
from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.routing import writer_for_user
from workers.streams.account_data import ACCOUNT_DATA
from workers.streams.to_device import TO_DEVICE

LEASE_S = 2.0


def _name_on(writer: str, writers: list[str]) -> str:
    """A user name whose account data and to-device sends both hash to `writer`."""
    return next(
        f"mover{i}"
        for i in range(200)
        if all(
            writer_for_user(f"@mover{i}:localhost", writers, s) == writer for s in (ACCOUNT_DATA, TO_DEVICE)
        )
    )


async def _holders(conn: asyncpg.Connection[Any], user: str) -> dict[str, str]:
    """The user's account-data and to-device holders."""
    rows = await conn.fetch(
        "SELECT stream, writer FROM stream_leases WHERE entity = $1 AND stream = ANY($2) AND NOT released",
        user, [ACCOUNT_DATA, TO_DEVICE],
    )  # fmt: skip
    return {r["stream"]: r["writer"] for r in rows}


@pytest.mark.parametrize("crash", [False, True])
async def test_a_users_writes_move_to_the_other_writer(
    make_cluster: MakeCluster, database_url: str, crash: bool
) -> None:
    cluster = await make_cluster(
        persisters=2, sync_workers=1, background_workers=0,
        extra_config={"writer_wait_s": 10.0, "instance_lease_s": LEASE_S},
    )  # fmt: skip
    owner, other = cluster.event_writers
    async with aiohttp.ClientSession() as session:
        alice, bob = ClusterClient(session, cluster.urls), ClusterClient(session, cluster.urls)
        await alice.register(_name_on(owner, cluster.event_writers), via="sync1")
        await bob.register("bob", via="sync1")

        async def write(n: str) -> None:
            await alice.put_account_data("io.fanout.test", {"n": n}, via="sync1")
            await alice.send_to_device("io.fanout.test", {str(bob.user_id): {"*": {"n": n}}}, via="sync1")

        await write("before")
        if crash:
            cluster.kill(owner)
        else:
            assert await cluster.stop(names=[owner]) == {owner: 0}
        started = time.monotonic()
        await write("during")  # a 5xx raises RequestRefused
        waited = time.monotonic() - started
        # A planned stop hands the user over at once; a crash only once the lease expired.
        assert waited < (LEASE_S + 8 if crash else 8), waited
        await cluster.start([owner])
        await write("after")
        received = (await bob.sync(via="sync1"))["to_device"]["events"]
        account = (await alice.sync(via="sync1"))["account_data"]["events"]
    assert [m["content"]["n"] for m in received if m["type"] == "io.fanout.test"] == [
        "before",
        "during",
        "after",
    ]
    assert {e["type"]: e["content"] for e in account}["io.fanout.test"] == {"n": "after"}
    conn = await asyncpg.connect(database_url)
    try:
        user = str(alice.user_id)
        assert await _holders(conn, user) == {ACCOUNT_DATA: other, TO_DEVICE: other}  # it stayed
        inbox = await conn.fetch(
            "SELECT instance_name FROM device_inbox WHERE user_id = $1 ORDER BY stream_id", bob.user_id
        )
        assert [r["instance_name"] for r in inbox] == [owner, other, other]
        written_by = await conn.fetchval(
            "SELECT instance_name FROM account_data WHERE user_id = $1 AND account_data_type = $2",
            user, "io.fanout.test",
        )  # fmt: skip
        assert written_by == other
    finally:
        await conn.close()


async def test_a_write_of_a_frozen_writer_whose_user_moved_does_not_commit(
    make_cluster: MakeCluster, database_url: str
) -> None:
    """The owner's account-data write is held inside its transaction (a table lock the test holds)
    while the owner is frozen past its instance lease; another write of the user moves the user to
    the other writer. Nobody took the frozen one's name, so it runs on once resumed, but its write
    must fail its lease check (the epoch moved) and never commit. Which stops it depends on the
    order the two runs take (the new holder's retry of the same PUT may land first, and then the
    frozen one writes nothing), so the rows are checked, not its log;
    `tests/workers/handlers/placement/test_leases.py` covers the lease check alone."""
    cluster = await make_cluster(
        persisters=2, sync_workers=1, background_workers=0,
        extra_config={"writer_wait_s": 15.0, "instance_lease_s": LEASE_S, "worker_request_timeout_s": 2.0},
    )  # fmt: skip
    owner, other = cluster.event_writers
    admin = await asyncpg.connect(database_url)
    try:
        async with aiohttp.ClientSession() as session:
            alice = ClusterClient(session, cluster.urls)
            await alice.register(_name_on(owner, cluster.event_writers), via="sync1")
            await alice.put_account_data("io.fanout.first", {"n": 0}, via="sync1")  # the owner takes alice
            user = str(alice.user_id)
            assert await _holders(admin, user) == {ACCOUNT_DATA: owner}
            process = cluster.workers[owner].process
            assert process is not None
            lock = admin.transaction()
            await lock.start()
            await admin.execute("LOCK TABLE account_data IN SHARE ROW EXCLUSIVE MODE")
            pending = asyncio.create_task(alice.put_account_data("io.fanout.first", {"n": 1}, via="sync1"))
            await until_blocked_on_lock(admin)
            process.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(LEASE_S + 1)
                moved = asyncio.create_task(alice.put_account_data("io.fanout.moved", {"n": 2}, via="sync1"))
                for _ in range(400):
                    if (await _holders(admin, user)).get(ACCOUNT_DATA) == other:
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError(f"{user} never moved to {other}")
                await lock.rollback()  # the new holder's write and the frozen one's both run on
                await moved
            finally:
                process.send_signal(signal.SIGCONT)
            outcome = (await asyncio.gather(pending, return_exceptions=True))[0]
            # Retried (a PUT is idempotent) on the new holder once the frozen one rolled back.
            assert outcome is None or (isinstance(outcome, RequestRefused) and outcome.status == 503), outcome
        rows = await admin.fetch(
            "SELECT account_data_type, content, instance_name FROM account_data WHERE user_id = $1"
            " ORDER BY account_data_type",
            user,
        )
        assert [(r["account_data_type"], r["instance_name"]) for r in rows] == [
            ("io.fanout.first", other if outcome is None else owner),
            ("io.fanout.moved", other),
        ]
        if outcome is not None:  # not retried: the frozen writer's {"n": 1} never landed
            assert rows[0]["content"] == '{"n": 0}'
        assert process.poll() is None  # its name was never taken: it serves on
    finally:
        await admin.close()
