"""Schema migrations and compatibility on a real PostgreSQL: the runner as `fanout migrate` and as a
worker's start-up, against schemas older and newer than this code.

A newer release is stood in for honestly: the real runner applies this code's migrations plus one
more (what the next release would ship, breaking or not), so the database records exactly what a
newer release would leave behind; then this code starts on it as a real process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.conftest import Servers
from tests.workers.worker_process import FANOUT, start_worker
from workers.storage.migrate import (
    MIGRATION_LOCK_KEY,
    Migration,
    SchemaMismatch,
    apply_migrations,
    available_migrations,
    code_version,
    migrate_url,
    read_state,
)

CODE = code_version()
NEXT_ADDITIVE = Migration(CODE + 1, "next_release_table", "CREATE TABLE next_release_table (x INTEGER)")
NEXT_BREAKING = Migration(
    CODE + 1, "next_release_rename", "ALTER TABLE users RENAME COLUMN created_ts TO created_ms", breaking=True
)


@pytest.fixture
async def empty_database(servers: Servers) -> AsyncIterator[str]:
    """A database with no schema at all (not a copy of the migrated template)."""
    name = f"m_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(servers.admin_url)
    await admin.execute(f"CREATE DATABASE {name}")
    await admin.close()
    yield servers.database_url(name)
    await servers.drop_database(name)


async def _apply(url: str, migrations: list[Migration], *, allow_breaking: bool = False) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        return await apply_migrations(conn, migrations=migrations, allow_breaking=allow_breaking)
    finally:
        await conn.close()


async def _state(url: str) -> tuple[list[int], int]:
    conn = await asyncpg.connect(url)
    try:
        state = await read_state(conn)
    finally:
        await conn.close()
    return sorted(state.applied), state.floor


def _config(database_url: str, redis_url: str, prefix: str, name: str = "w1") -> dict[str, Any]:
    return {
        "instance_name": name,
        "database_url": database_url,
        "redis_url": redis_url,
        "channel_prefix": prefix,
        "stream_writers": {"events": ["w1", "w2"]},
        "http_port": 0,
        "startup_retry_s": 1,
        "event_loop": "asyncio",
    }


def _run_worker(config: dict[str, Any], path: Path) -> subprocess.CompletedProcess[str]:
    import yaml

    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    return subprocess.run(
        [FANOUT, "worker", "--config", str(path)], env=env, capture_output=True, text=True, timeout=60
    )


def _stop(process: subprocess.Popen[str]) -> str:
    process.terminate()
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    return stderr


async def test_old_code_refuses_a_schema_whose_floor_is_above_it(
    empty_database: str, redis_url: str, channel_prefix: str, tmp_path: Path
) -> None:
    """The next release applied a breaking migration (as `fanout migrate` does): this code, now the
    old code, refuses to start as a worker and to migrate, with one line naming both versions."""
    assert await _apply(empty_database, [*available_migrations(), NEXT_BREAKING], allow_breaking=True)
    shipped = [m.version for m in available_migrations()]
    assert await _state(empty_database) == ([*shipped, CODE + 1], CODE + 1)

    result = await asyncio.to_thread(
        _run_worker, _config(empty_database, redis_url, channel_prefix), tmp_path / "w.yaml"
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("fanout: ")]
    assert lines == [
        f"fanout: the database schema (version {CODE + 1}) needs code of schema version {CODE + 1} or"
        f" newer (its compat floor); this code is at schema version {CODE}"
        f" (fanout {_package_version()}): run a newer release"
    ], result.stderr

    migrate = await asyncio.to_thread(
        subprocess.run, [FANOUT, "migrate", "--database-url", empty_database], capture_output=True, text=True
    )
    assert migrate.returncode == 2 and "its compat floor" in migrate.stderr, migrate.stderr
    assert "Traceback" not in migrate.stderr


def _package_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("fanout")


async def test_old_code_runs_on_a_newer_additive_schema(
    empty_database: str, redis_url: str, channel_prefix: str, tmp_path: Path
) -> None:
    """A rolling upgrade: the first new worker applied an additive migration; a worker of this
    (older) code restarted meanwhile still starts, and says what it saw."""
    await _apply(empty_database, [*available_migrations(), NEXT_ADDITIVE])
    process = start_worker(_config(empty_database, redis_url, channel_prefix), tmp_path / "w.yaml")
    stderr = _stop(process)
    assert f"schema version {CODE + 1} is newer than this code's {CODE}; its compat floor 0" in stderr
    assert await _state(empty_database) == ([*(m.version for m in available_migrations()), CODE + 1], 0)


async def test_new_code_migrates_an_old_schema(
    empty_database: str, redis_url: str, channel_prefix: str, tmp_path: Path
) -> None:
    """A database left by an older release (one that shipped the first three migrations): this
    code's worker applies the rest at start-up and serves."""
    shipped = available_migrations()
    assert await _apply(empty_database, shipped[:3]) == [m.version for m in shipped[:3]]
    process = start_worker(_config(empty_database, redis_url, channel_prefix), tmp_path / "w.yaml")
    stderr = _stop(process)
    for m in shipped[3:]:
        assert f"applying migration version={m.version} name={m.name}" in stderr
    assert await _state(empty_database) == ([m.version for m in shipped], 0)


async def test_a_worker_never_applies_a_breaking_migration_and_migrate_waits_for_every_worker_to_stop(
    database_url: str, redis_url: str, channel_prefix: str, tmp_path: Path
) -> None:
    next_release = [*available_migrations(), NEXT_BREAKING]
    with pytest.raises(SchemaMismatch, match=r"is breaking: .*stop every worker, run `fanout migrate"):
        await _apply(database_url, next_release)
    process = start_worker(_config(database_url, redis_url, channel_prefix), tmp_path / "w.yaml")
    try:
        running = rf"workers still run on this database \({channel_prefix}/w1\)"
        with pytest.raises(SchemaMismatch, match=running):
            await _apply(database_url, next_release, allow_breaking=True)
    finally:
        _stop(process)
    assert await _state(database_url) == ([m.version for m in available_migrations()], 0)
    assert await _apply(database_url, next_release, allow_breaking=True) == [CODE + 1]
    assert (await _state(database_url))[1] == CODE + 1


async def test_applied_versions_this_code_does_not_know_are_refused_below_its_own(database_url: str) -> None:
    """Only a newer release's versions (above this code's) are taken as compatible under the floor;
    a renamed or missing one below is another build's database."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("UPDATE schema_version SET name = 'elsewhere' WHERE version = 2")
        with pytest.raises(SchemaMismatch, match="applied migration 2 is 'elsewhere'"):
            await apply_migrations(conn)
        await conn.execute("DELETE FROM schema_version WHERE version = 2")
        with pytest.raises(SchemaMismatch, match=r"migrations \[2\] are not applied but newer ones are"):
            await apply_migrations(conn)
        await conn.execute("INSERT INTO schema_version VALUES (2, 'replication_applied_ranges')")
        unknown = r"applied migration 3 \('clients'\) is not one this code ships"
        with pytest.raises(SchemaMismatch, match=unknown):
            await apply_migrations(conn, migrations=[m for m in available_migrations() if m.version != 3])
        assert await apply_migrations(conn) == []
    finally:
        await conn.close()


async def test_two_processes_migrating_at_once_end_with_one_schema(empty_database: str) -> None:
    url = empty_database
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workers.cli", "migrate", "--database-url", url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]  # fmt: skip
    results = [await p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    outputs = sorted(out.decode() for out, _ in results)
    # Exactly one of them applied the migrations; the other found them applied.
    assert outputs[0].startswith("applied: [") and "up to date" in outputs[1], outputs
    conn = await asyncpg.connect(url)
    versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_version ORDER BY 1")]
    assert versions == [m.version for m in available_migrations()]
    assert await conn.fetchval("SELECT count(*) FROM pg_class WHERE relname = 'stream_positions'") == 1
    await conn.close()


async def test_two_workers_racing_one_applies_the_other_waits_for_the_lock(
    empty_database: str, redis_url: str, channel_prefix: str, tmp_path: Path
) -> None:
    """Two workers start on an empty database while a third session holds the migration lock:
    both wait (and say so), then exactly one applies every migration and both serve."""
    holder = await asyncpg.connect(empty_database)
    await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    started = [
        asyncio.create_task(
            asyncio.to_thread(
                start_worker,
                _config(empty_database, redis_url, channel_prefix, name),
                tmp_path / f"{name}.yaml",
            )
        )
        for name in ("w1", "w2")
    ]
    waiting = 0
    for _ in range(600):  # until both ask for the lock (their start-up takes a few seconds)
        waiting = await holder.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = $1"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            MIGRATION_LOCK_KEY & 0xFFFFFFFF,
        )
        if waiting == 2 or any(task.done() for task in started):
            break
        await asyncio.sleep(0.1)
    assert waiting == 2 and not any(task.done() for task in started)
    assert await _state(empty_database) == ([], 0)
    await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    await holder.close()
    processes = await asyncio.gather(*started)
    logs = [_stop(p) for p in processes]
    assert all("waiting for the schema migration lock (held by backend pid" in log for log in logs), logs
    applied = ["applying migration version=1 " in log for log in logs]
    assert sorted(applied) == [False, True], logs
    assert await _state(empty_database) == ([m.version for m in available_migrations()], 0)


async def test_migrating_again_is_a_no_op(database_url: str) -> None:
    assert await migrate_url(database_url) == []


async def test_migrate_status_names_both_versions(database_url: str) -> None:
    result = await asyncio.to_thread(
        subprocess.run, [FANOUT, "migrate", "--database-url", database_url, "--status"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"schema version {CODE}, compat floor 0; this code: schema version {CODE}"
        f" (fanout {_package_version()}); pending: none"
    )
