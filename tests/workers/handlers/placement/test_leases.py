"""Leases of a stored stream's users between two writers (in-process workers on the real
PostgreSQL and Redis): the first write takes the user on its writer, another writer names the
holder, a planned stop hands the user on, a holder whose instance lease ended loses the user and
its write does not commit, a key whose last row was not seen is not written, while a worker of
the previous release runs only the hashed writer takes a user, and a reload that removes a writer
of a stream hands its users on."""

from __future__ import annotations

import asyncio

import pytest

from tests.compat.previous_worker import previous_release_worker
from tests.pubsub.conftest import wait_for
from tests.workers.conftest import MakeWorker
from workers.app import Worker
from workers.assembly.reload import plan_reload
from workers.handlers.placement.leases import KeyLeaseLost, KeyMoving, NotOwner
from workers.routing import writer_for_user
from workers.storage import connect
from workers.streams.account_data import ACCOUNT_DATA

WRITERS = ["w1", "w2"]


def _user_of(writer: str) -> str:
    return next(u for i in range(100) if writer_for_user(u := f"@u{i}:hs", WRITERS, ACCOUNT_DATA) == writer)


def _put(user: str, n: int) -> dict[str, object]:
    return {"user_id": user, "room_id": None, "type": "m.test", "content": {"n": n}}


async def _pair(make_worker: MakeWorker, **fields: object) -> tuple[Worker, Worker]:
    fields.setdefault("writer_wait_s", 5.0)
    return await make_worker("w1", WRITERS, **fields), await make_worker("w2", WRITERS, **fields)


async def _lease(database_url: str, user: str) -> tuple[str, int, bool] | None:
    async with connect(database_url) as conn:
        row = await conn.fetchrow(
            "SELECT writer, epoch, released FROM stream_leases WHERE stream = $1 AND entity = $2",
            ACCOUNT_DATA, user,
        )  # fmt: skip
    return None if row is None else (row["writer"], row["epoch"], row["released"])


async def _stored(database_url: str, user: str) -> tuple[str, str]:
    async with connect(database_url) as conn:
        row = await conn.fetchrow(
            "SELECT content, instance_name FROM account_data"
            " WHERE user_id = $1 AND account_data_type = 'm.test'",
            user,
        )
    assert row is not None
    return row["content"], row["instance_name"]


async def test_a_user_is_taken_on_its_hashed_writer_and_handed_on_at_a_planned_stop(
    make_worker: MakeWorker, database_url: str
) -> None:
    w1, w2 = await _pair(make_worker)
    user = _user_of("w1")
    await w2.stored.account_data.put(user, None, "m.test", {"n": 1})  # forwarded to w1, which takes it
    assert await _lease(database_url, user) == ("w1", 1, False)
    with pytest.raises(NotOwner) as held:
        await w2.stored.writes[ACCOUNT_DATA].run_here(user, "put", _put(user, 0))
    assert held.value.holder == "w1"
    assert await w1.stored.writes[ACCOUNT_DATA].drain(1.0)  # what a SIGTERM does
    assert await _lease(database_url, user) == ("w1", 1, True)
    await w2.stored.account_data.put(user, None, "m.test", {"n": 2})  # w1 refuses: w2 takes it
    assert await _lease(database_url, user) == ("w2", 2, False)
    assert await _stored(database_url, user) == ('{"n": 2}', "w2")
    leases = w2.stored.writes[ACCOUNT_DATA].leases
    assert leases is not None and leases.taken_from_others == 1  # it waited to see w1's row


async def test_a_holder_whose_instance_lease_ended_loses_the_user_and_cannot_commit(
    make_worker: MakeWorker, database_url: str, channel_prefix: str
) -> None:
    w1, w2 = await _pair(make_worker, instance_lease_s=60.0)  # renewed every 20s: none during the test
    user = _user_of("w1")
    await w1.stored.account_data.put(user, None, "m.test", {"n": 1})
    async with connect(database_url) as conn:  # w1 as though frozen past its instance lease
        await conn.execute(
            "UPDATE instance_leases SET expires_at = now() WHERE lease_key = $1", f"{channel_prefix}/w1"
        )
    await w2.stored.writes[ACCOUNT_DATA].run_here(user, "put", _put(user, 2))
    assert await _lease(database_url, user) == ("w2", 2, False)
    w1_writes = w1.stored.writes[ACCOUNT_DATA]
    assert w1_writes.leases is not None and user in w1_writes.leases.held  # it has not noticed
    with pytest.raises(KeyLeaseLost):
        await w1_writes.run_here(user, "put", _put(user, 3))
    assert user not in w1_writes.leases.held
    assert await _stored(database_url, user) == ('{"n": 2}', "w2")
    with pytest.raises(NotOwner):  # its next write learns the holder
        await w1_writes.run_here(user, "put", _put(user, 3))


async def test_a_user_whose_last_row_was_not_seen_is_not_written(
    make_worker: MakeWorker, database_url: str
) -> None:
    w1, _ = await _pair(make_worker)
    user = _user_of("w1")
    async with connect(database_url) as conn:  # a crashed writer's last row, never announced
        await conn.execute("INSERT INTO account_data VALUES ($1, 'm.test', '{}', 1000000000, 'gone')", user)
    with pytest.raises(KeyMoving):
        await w1.stored.writes[ACCOUNT_DATA].run_here(user, "put", _put(user, 1))
    assert await _stored(database_url, user) == ("{}", "gone")


async def test_while_a_previous_release_worker_runs_only_the_hashed_writer_takes_a_user(
    make_worker: MakeWorker, database_url: str, channel_prefix: str
) -> None:
    async with previous_release_worker(database_url, f"{channel_prefix}/old1"):
        _, w2 = await _pair(make_worker)
        user = _user_of("w1")
        with pytest.raises(KeyMoving):
            await w2.stored.writes[ACCOUNT_DATA].run_here(user, "put", _put(user, 1))
        assert await _lease(database_url, user) is None


async def test_a_reload_that_removes_a_streams_writer_hands_its_users_on(
    make_worker: MakeWorker, database_url: str
) -> None:
    w1, w2 = await _pair(make_worker)
    user = _user_of("w1")
    await w1.stored.account_data.put(user, None, "m.test", {"n": 1})
    writers = {**w1.config.stream_writers, ACCOUNT_DATA: ["w2"]}
    w1.live_writers.apply(plan_reload(w1.config, w1.config.model_copy(update={"stream_writers": writers})))
    await wait_for(lambda: w1.stored.writes[ACCOUNT_DATA].placement.writers == ["w2"])
    for _ in range(100):
        if await _lease(database_url, user) == ("w1", 1, True):
            break
        await asyncio.sleep(0.05)
    assert await _lease(database_url, user) == ("w1", 1, True)
    await w2.stored.account_data.put(user, None, "m.test", {"n": 2})
    assert await _lease(database_url, user) == ("w2", 2, False)
