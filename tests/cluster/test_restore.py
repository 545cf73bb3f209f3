"""The restore drill: a backup taken with `pg_dump` under load, the load going on past it, the
cluster stopped, the dump restored into a fresh database (docs/operations.md's commands, run as
written: `workers.harness.backup`), and the same cluster restarted on it with the same Redis.

Checked after the restart: every worker starts; the Redis position hints (ahead of the restored
data) are not taken by anyone and are overwritten from the restored sequences, and one beyond the
sequence is deleted with a warning; the same clients go on with the tokens they held before (ahead
of the restored data) and are answered without an error, and then see every event persisted after
the restore exactly once (the history check over a second load phase), and at once: a token from
before the restore is answered from the current position, not "nothing new" until the caches
stream moves; every ID handed out after
the restore is above every ID handed out before it, and no `stream_positions` row is past its
sequence. Beside it: point-in-time recovery from archived WAL on a server of its own, and the check
that the docs print the commands these tests run.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg
import redis.asyncio as aioredis

from pubsub import keys
from tests.conftest import Servers
from workers.embedded.services import start_postgres
from workers.harness import backup
from workers.harness.cluster import LocalCluster
from workers.harness.history import stream_token
from workers.harness.load_check import LoadReport, keep_for_diagnosis
from workers.harness.loadgen import LoadDriver, LoadPlan
from workers.streams import account_data, device_lists, receipts, to_device

ROOT = Path(__file__).resolve().parents[2]
WRITERS = ["persister1", "persister2"]
#: stream -> (sequence, its tables' (table, id column)); the stream_positions name is the stream's.
STREAMS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "events": ("events_stream_seq", [("events", "stream_ordering")]),
    "caches": ("cache_invalidation_stream_seq", [("cache_invalidation_stream_by_instance", "stream_id")]),
    account_data.ACCOUNT_DATA: (account_data.SEQUENCE, [(t, c) for t, _i, c in account_data.TABLES]),
    device_lists.DEVICE_LISTS: (device_lists.SEQUENCE, [(t, c) for t, _i, c in device_lists.TABLES]),
    to_device.TO_DEVICE: (to_device.SEQUENCE, [(t, c) for t, _i, c in to_device.TABLES]),
    receipts.RECEIPTS: (receipts.SEQUENCE, [(t, c) for t, _i, c in receipts.TABLES]),
}


def plan(seed: int) -> LoadPlan:
    return LoadPlan(
        users=8, rooms=6, rooms_per_user=3, actions=400, concurrency=8, sync_timeout_ms=500, seed=seed
    )


async def sequence_values(url: str) -> dict[str, int]:
    """Each stream sequence's last value handed out (0: none yet)."""
    conn = await asyncpg.connect(url)
    try:
        return {
            seq: int(await conn.fetchval(f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {seq}"))
            for seq, _tables in STREAMS.values()
        }
    finally:
        await conn.close()


async def table_maxima(url: str) -> dict[str, int]:
    """The highest ID in each stream table (0 when empty)."""
    conn = await asyncpg.connect(url)
    try:
        return {
            table: int(await conn.fetchval(f"SELECT coalesce(max({column}), 0) FROM {table}"))
            for _seq, tables in STREAMS.values()
            for table, column in tables
        }
    finally:
        await conn.close()


@dataclass(frozen=True)
class RestoredState:
    """What the restored database holds of the load's state: the writes past the backup are gone."""

    #: (user, room) -> the user's membership (its last member event).
    membership: dict[tuple[str, str], str]
    #: (user, device) -> the one-time key ids waiting (uploaded, not claimed).
    one_time_keys: dict[tuple[str, str], list[str]]


async def restored_state(url: str) -> RestoredState:
    conn = await asyncpg.connect(url)
    try:
        members = await conn.fetch(
            "SELECT DISTINCT ON (room_id, state_key) state_key, room_id,"
            " json::jsonb->'content'->>'membership' AS membership FROM events"
            " WHERE type = 'm.room.member' AND stream_ordering > 0"
            " ORDER BY room_id, state_key, stream_ordering DESC"
        )
        keys_left = await conn.fetch(
            "SELECT user_id, device_id, key_id FROM e2e_one_time_keys ORDER BY 1, 2, 3"
        )
    finally:
        await conn.close()
    waiting: dict[tuple[str, str], list[str]] = {}
    for r in keys_left:
        waiting.setdefault((r["user_id"], r["device_id"]), []).append(r["key_id"])
    return RestoredState({(r["state_key"], r["room_id"]): r["membership"] for r in members}, waiting)


def carry_over(before: LoadDriver, after: LoadDriver, restored: RestoredState) -> None:
    """`after` drives the same clients, rooms and readers as `before` (each reader keeps its token;
    what it recorded before the restore is dropped: the check covers the second phase), with what the
    restored database holds: memberships and waiting one-time keys; no receipt is expected from
    before, and none is set on an event a reader saw before (it may be one the restore lost)."""
    after.clients, after.readers, after.probes = before.clients, before.readers, before.probes
    after.rooms, after.knock_room, after.locks = before.rooms, before.knock_room, before.locks
    after._run_id, after._sent = before._run_id, before._sent  # unique names go on where they were
    for reader in after.readers + after.probes:
        reader.records, reader.arrivals, reader.latest = [], {}, {}
        reader.typing_seen = reader.presence_seen = reader.failed_syncs = reader.internal_errors = 0
    after.joined = {str(c.user_id): set() for c in after.clients}
    for client in after.clients:
        user = str(client.user_id)
        for room in (*after.rooms, after.knock_room):
            after._set(user, room, restored.membership.get((user, room)))
    after.keys_uploaded = {device: list(ids) for device, ids in restored.one_time_keys.items()}


async def restored_hints(redis_url: str, prefix: str) -> dict[str, int]:
    client = aioredis.from_url(redis_url)
    try:
        raw = await client.hgetall(keys.positions_key(prefix, "events"))
    finally:
        await client.aclose()
    return {k.decode(): int(v) for k, v in raw.items()}


async def set_hint(redis_url: str, prefix: str, instance: str, position: int) -> None:
    client = aioredis.from_url(redis_url)
    try:
        await client.hset(keys.positions_key(prefix, "events"), instance, str(position))
    finally:
        await client.aclose()


async def assert_clean(driver: LoadDriver, report: LoadReport, phase: str, keep: Path) -> None:
    """The phase's load is clean; if not, what the diagnosis needs is kept in `keep` (pytest keeps
    the last runs' temporary directories): the readers' syncs, the stored events they were checked
    against, and, beside them, the workers' logs."""
    if report.problems:
        await keep_for_diagnosis(driver, keep, phase)
    assert report.problems == [], (phase, report.problems[:10], str(keep))
    assert report.internal_errors == 0, phase
    assert report.events_sent > 0 and report.events_checked > 0, phase


def test_the_documented_commands_are_the_ones_run() -> None:
    """Each command of the procedures, with the docs' placeholders, is a line of docs/operations.md."""
    docs = (ROOT / "docs" / "operations.md").read_text().splitlines()
    steps = {
        **backup.procedure("$DATABASE_URL", "$BACKUP", "$ADMIN_URL", "fanout_restored", "$RESTORED_URL"),
        **backup.archiving("$DATABASE_URL", "$WAL", "$BASE"),
    }
    for phase in steps.values():
        for step in phase:
            assert backup.shell_line(step.argv) in docs, step.purpose
    for line in backup.RECOVER:
        assert line in docs, line


def test_point_in_time_recovery_from_archived_wal() -> None:
    """The documented archiving and recovery, on a server of its own: recovered to a time between two
    writes, the first is there and the second is not. Not under pytest's tmp_path: another pytest
    session of the same user resets its root to 0700, and the server's user (nobody) loses its way in."""
    with tempfile.TemporaryDirectory(prefix="fanout-pitr-") as scratch:
        point_in_time_recovery(Path(scratch))


def point_in_time_recovery(root: Path) -> None:
    data, wal, base = root / "pg" / "data", root / "wal", root / "base"
    wal.mkdir()
    wal.chmod(0o777)  # the server's user (nobody, under root) archives into it
    server = start_postgres(data, durable=True)
    try:
        asyncio.run(backup.run(backup.archiving(server.url, str(wal), str(base))["archive"]))
        server.stop()
        server = start_postgres(data, durable=True)  # a new port: a new URL
        url = server.url
        asyncio.run(sql(url, "CREATE TABLE drill (n int)", "INSERT INTO drill VALUES (1)"))
        asyncio.run(backup.run(backup.archiving(url, str(wal), str(base))["base_backup"]))
        asyncio.run(sql(url, "INSERT INTO drill VALUES (2)"))
        time.sleep(1.0)
        target = asyncio.run(sql(url, "SELECT now()::text"))
        time.sleep(1.0)
        segment = asyncio.run(
            sql(url, "INSERT INTO drill VALUES (3)", "SELECT pg_walfile_name(pg_switch_wal())")
        )
        # Recovery to `target` needs the archive to reach a commit after it: wait for the segment.
        deadline = time.monotonic() + 30
        while (
            asyncio.run(sql(url, "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver")) != segment
        ):
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)
        server.stop()
        env = {"PGDATA": str(data), "BASE": str(base), "WAL": str(wal), "T": str(target)}
        asyncio.run(backup.run_shell(backup.RECOVER, env))
        if os.geteuid() == 0:  # the lines ran as root here, not as the server's user: hand it over
            nobody = pwd.getpwnam("nobody")
            for path in (data, *data.rglob("*")):
                os.chown(path, nobody.pw_uid, nobody.pw_gid)
        server = start_postgres(data, durable=True)
        deadline = time.monotonic() + 30
        while asyncio.run(sql(server.url, "SELECT pg_is_in_recovery()::text")) != "false":
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.2)
        assert asyncio.run(sql(server.url, "SELECT string_agg(n::text, ',' ORDER BY n) FROM drill")) == "1,2"
    finally:
        server.stop()


async def sql(url: str, *statements: str) -> str | None:
    """Run `statements` in order; the last one's value."""
    conn = await asyncpg.connect(url)
    try:
        value = None
        for statement in statements:
            value = await conn.fetchval(statement)
        return value
    finally:
        await conn.close()


async def test_restore_from_a_dump_taken_under_load(
    servers: Servers, database_url: str, redis_url: str, channel_prefix: str, tmp_path: Path
) -> None:
    dump = str(tmp_path / "fanout.dump")
    restored_name = f"r_{uuid.uuid4().hex[:16]}"
    restored_url = servers.database_url(restored_name)
    steps = backup.procedure(database_url, dump, servers.admin_url, restored_name, restored_url)
    timings: dict[str, float] = {}
    cluster = LocalCluster(
        database_url, redis_url, tmp_path / "cluster", channel_prefix=channel_prefix,
        announce_interval_s=0.2, background_workers=0,
    )  # fmt: skip
    try:
        await cluster.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            first = LoadDriver(session, cluster.urls, WRITERS, cluster.sync_workers, database_url, plan(7))
            await first.setup()
            load = asyncio.create_task(first.run())
            deadline = time.monotonic() + 120
            while first.report.events_sent < plan(7).actions // 3:
                assert time.monotonic() < deadline and not load.done(), "the load did not start"
                await asyncio.sleep(0.05)
            started = time.monotonic()
            await backup.run(steps["backup"])
            timings["pg_dump under load"] = time.monotonic() - started
            sent_at_dump = first.report.events_sent
            await assert_clean(first, await load, "before the restore", tmp_path)
            assert first.report.events_sent > sent_at_dump, "no write after the dump: nothing to lose"
            handed_out = await sequence_values(database_url)
            tokens_before = {str(r.client.user_id): r.token for r in first.readers + first.probes}
            codes = await cluster.stop()
            assert all(code == 0 for code in codes.values()), codes

            started = time.monotonic()
            await backup.run(steps["restore"])
            timings["create, pg_restore, advance"] = time.monotonic() - started
            restored = await table_maxima(restored_url)
            floor = await sequence_values(restored_url)
            assert restored["events"] < handed_out["events_stream_seq"], "the dump holds every event"
            hints = await restored_hints(redis_url, channel_prefix)
            assert max(hints.values()) > restored["events"], ("Redis hints not ahead of the restore", hints)
            for seq, value in floor.items():
                assert value > handed_out[seq], (seq, "the sequence did not move past the old cluster")

            # A retired writer's hint beyond even the moved sequence (as a too small gap would leave).
            beyond = floor["events_stream_seq"] + 1000
            await set_hint(redis_url, channel_prefix, "retired", beyond)

            cluster.database_url = restored_url  # same names, ports and Redis: the deployment as it was
            started = time.monotonic()
            await cluster.start()
            timings["restart until every worker is ready"] = time.monotonic() - started
            # Nobody took a hint: the one beyond the sequence is gone with a warning, and each writer
            # overwrote its own with a position of the restored sequence.
            logs = [cluster.log_path(w).read_text(errors="replace") for w in cluster.workers]
            assert any("beyond the database's sequence" in text for text in logs)
            deadline = time.monotonic() + 10
            while not all(
                floor["events_stream_seq"] <= v < beyond
                for v in (await restored_hints(redis_url, channel_prefix)).values()
            ):
                assert time.monotonic() < deadline, await restored_hints(redis_url, channel_prefix)
                await asyncio.sleep(0.1)
            assert set(await restored_hints(redis_url, channel_prefix)) == set(WRITERS)

            # A token from before the restore is answered from the current position at once, not
            # "nothing new" with itself until a worker writes a caches row (the stream starts at its
            # table's highest ID, or at `backup.MARK_CACHES_SQL`'s mark).
            for reader in first.readers + first.probes:
                old = tokens_before[str(reader.client.user_id)]
                for worker in cluster.sync_workers if old is not None else ():
                    body = await reader.client.sync(via=worker, since=old)
                    assert body["next_batch"] != old, (worker, old)
            second = LoadDriver(session, cluster.urls, WRITERS, cluster.sync_workers, restored_url, plan(8))
            carry_over(first, second, await restored_state(restored_url))
            ahead = [
                user
                for user, token in tokens_before.items()
                if token is not None and stream_token(token).get_max_stream_pos() > restored["events"]
            ]
            assert ahead, "no client held a token ahead of the restored database"
            report = await second.run()
            await assert_clean(second, report, "after the restore", tmp_path)
            for reader in second.readers + second.probes:
                user = str(reader.client.user_id)
                assert reader.failed_syncs == 0, (user, "a sync failed after the restore")
                assert reader.records and reader.records[0].since == tokens_before[user], user
    finally:
        await cluster.stop()

    now = await sequence_values(restored_url)
    conn = await asyncpg.connect(restored_url)
    try:
        for stream, (seq, tables) in STREAMS.items():
            for table, column in tables:
                low = await conn.fetchval(
                    f"SELECT min({column}) FROM {table} WHERE {column} > $1", restored[table]
                )
                if low is not None:  # written after the restore: above all that was handed out before
                    assert low > handed_out[seq], (table, low, handed_out[seq])
            rows = await conn.fetch(
                "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = $1", stream
            )
            assert all(r["stream_id"] <= now[seq] for r in rows), (stream, rows, now[seq])
        assert await conn.fetchval("SELECT count(*) = count(DISTINCT stream_ordering) FROM events")
        new_events = await conn.fetchval(
            "SELECT count(*) FROM events WHERE stream_ordering > $1", restored["events"]
        )
        assert new_events >= report.events_sent
    finally:
        await conn.close()
        await servers.drop_database(restored_name)
    print({phase: round(seconds, 2) for phase, seconds in timings.items()})
