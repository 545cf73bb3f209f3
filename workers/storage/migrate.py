"""Versioned SQL migrations, applied at start-up under a Postgres advisory lock.

Files live in `workers/storage/migrations/` as `NNNN_name.sql` and are applied in order, each in
its own transaction together with its row in `schema_version`. Two processes starting together
serialize on the advisory lock: the second waits, then finds everything applied. An applied
migration is never edited; a change goes in a new file.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from workers.storage import Conn

log = logging.getLogger(__name__)

# Arbitrary constant shared by every fanout process: "fanout schema migration".
MIGRATION_LOCK_KEY = 0x66616E6F7574
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    found: list[Migration] = []
    for entry in resources.files("workers.storage").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version number: {versions}")
    return found


async def apply_migrations(conn: Conn) -> list[int]:
    """Bring the database to the newest schema; returns the versions this call applied."""
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        applied = {r["version"] for r in await conn.fetch("SELECT version FROM schema_version")}
        done: list[int] = []
        for migration in available_migrations():
            if migration.version in applied:
                continue
            log.info("applying migration version=%d name=%s", migration.version, migration.name)
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_version (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
            done.append(migration.version)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


async def migrate_url(database_url: str) -> list[int]:
    """Connect, migrate, disconnect."""
    conn = await asyncpg.connect(database_url)
    try:
        return await apply_migrations(conn)
    finally:
        await conn.close()
