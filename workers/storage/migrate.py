"""Versioned SQL migrations, applied at start-up under a Postgres advisory lock, and the schema's
compatibility floor.

Files live in `workers/storage/migrations/` as `NNNN_name.sql` and are applied in order, each in
its own transaction together with its row in `schema_version`. Two processes starting together
serialize on the advisory lock: the second waits (and says so), then finds everything applied. An
applied migration is never edited; a change goes in a new file.

Compatibility. The code's schema version is the newest migration it ships (`code_version`). The
schema records its version (the newest applied) and a compat floor (`schema_compat.floor`): the
oldest code version that can still run on it. A migration is additive by default (old code keeps
working on the new schema: new tables, new nullable or defaulted columns) and leaves the floor
alone. A migration whose first line is `-- fanout: breaking` raises the floor to its own version:
workers never apply one at start-up, because their peers of the previous release would then run on
a schema they cannot read; `fanout migrate` does, once every worker is stopped. Every start checks,
under the lock and before applying anything:

* code older than the floor refuses to run (`SchemaMismatch`, naming both versions);
* applied versions this code does not ship are a newer release's when above `code_version` (fine
  under the floor: logged), and a different build's when below it (refused), as is an applied
  version whose name differs from the shipped file's or a shipped migration missing below the
  newest applied one.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from importlib import resources

import asyncpg

from workers.errors import WorkerError
from workers.storage import Conn

log = logging.getLogger(__name__)

# Arbitrary constant shared by every fanout process: "fanout schema migration".
MIGRATION_LOCK_KEY = 0x66616E6F7574
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
#: The first line of a migration that old code cannot run on.
BREAKING_MARKER = "-- fanout: breaking"


class SchemaMismatch(WorkerError):
    """This code must not run on (or migrate) this database as it is; str(error) says what to do.
    Start-up maps it to exit 2: the operator must change what runs, retrying cannot help."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str
    breaking: bool = False


@dataclass(frozen=True, slots=True)
class SchemaState:
    """What the database records: applied versions with their names, and the compat floor."""

    applied: dict[int, str]
    floor: int

    @property
    def version(self) -> int:
        """The newest applied migration; 0 for an empty database."""
        return max(self.applied, default=0)


def available_migrations() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    found: list[Migration] = []
    for entry in resources.files("workers.storage").joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            sql = entry.read_text()
            breaking = sql.split("\n", 1)[0].strip() == BREAKING_MARKER
            found.append(Migration(int(match.group(1)), match.group(2), sql, breaking))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version number: {versions}")
    return found


def code_version(migrations: Sequence[Migration] | None = None) -> int:
    """This code's schema version: the newest migration it ships."""
    shipped = available_migrations() if migrations is None else migrations
    return max((m.version for m in shipped), default=0)


def package_version() -> str:
    """The installed package's version (pyproject.toml's, through the package metadata)."""
    try:
        return importlib.metadata.version("fanout")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


async def _create_bookkeeping(conn: Conn) -> None:
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
        " applied_at TIMESTAMPTZ NOT NULL DEFAULT now());"
        "CREATE TABLE IF NOT EXISTS schema_compat ("
        " one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), floor INTEGER NOT NULL);"
        "INSERT INTO schema_compat (floor) VALUES (0) ON CONFLICT DO NOTHING"
    )


async def read_state(conn: Conn) -> SchemaState:
    """The schema's state; an empty database reads as no migration and floor 0."""
    if await conn.fetchval("SELECT to_regclass('schema_version') IS NULL"):
        return SchemaState({}, 0)
    applied = {r["version"]: r["name"] for r in await conn.fetch("SELECT version, name FROM schema_version")}
    floor = 0
    if await conn.fetchval("SELECT to_regclass('schema_compat') IS NOT NULL"):
        floor = await conn.fetchval("SELECT floor FROM schema_compat") or 0
    return SchemaState(applied, floor)


def check_compatible(state: SchemaState, shipped: Sequence[Migration]) -> None:
    """Raise `SchemaMismatch` unless code shipping `shipped` may run on (and migrate) `state`."""
    code = code_version(shipped)
    this = f"this code is at schema version {code} (fanout {package_version()})"
    if state.floor > code:
        raise SchemaMismatch(
            f"the database schema (version {state.version}) needs code of schema version"
            f" {state.floor} or newer (its compat floor); {this}: run a newer release"
        )
    names = {m.version: m.name for m in shipped}
    for version, name in sorted(state.applied.items()):
        if version in names and names[version] != name:
            raise SchemaMismatch(
                f"applied migration {version} is {name!r} but this code ships {names[version]!r}"
                f" as {version}: the database belongs to another build; {this}"
            )
        if version not in names and version < code:
            raise SchemaMismatch(
                f"applied migration {version} ({name!r}) is not one this code ships: the database"
                f" belongs to another build; {this}"
            )
    missing = [m.version for m in shipped if m.version not in state.applied and m.version < state.version]
    if missing:
        raise SchemaMismatch(
            f"migrations {missing} are not applied but newer ones are (schema version"
            f" {state.version}): the database belongs to another build; {this}"
        )


#: A granted session advisory lock of this database: its bigint key, from the two halves pg_locks
#: shows (advisory locks are per database; pg_locks lists the whole server's).
_ADVISORY_KEY = (
    "locktype = 'advisory' AND granted AND objsubid = 1"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND ((classid::bigint << 32) | objid::bigint)"
)


async def live_workers(conn: Conn) -> list[str]:
    """The instance names (`prefix/name`) whose lease is held now: the workers running on this
    database (`workers.process.instance_lease`: an unexpired lease row; a worker of a release before lease
    rows holds a session advisory lock instead)."""
    if await conn.fetchval("SELECT to_regclass('instance_leases') IS NULL"):
        return []
    has_expiry = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns"
        " WHERE table_name = 'instance_leases' AND column_name = 'expires_at')"
    )
    by_row = "l.expires_at > now() OR " if has_expiry else ""
    rows = await conn.fetch(
        f"SELECT lease_key FROM instance_leases l WHERE {by_row}EXISTS (SELECT 1 FROM pg_locks"
        f" WHERE {_ADVISORY_KEY} = hashtextextended(l.lease_key, 0)) ORDER BY 1"
    )
    return [r["lease_key"] for r in rows]


async def previous_release_workers(conn: Conn, prefix: str) -> list[str]:
    """The instance names under `prefix` held now by workers of a release before lease rows: a
    session advisory lock on the name, which no worker of this release takes."""
    rows = await conn.fetch(
        f"SELECT lease_key FROM instance_leases l WHERE starts_with(l.lease_key, $1) AND EXISTS"
        f" (SELECT 1 FROM pg_locks WHERE {_ADVISORY_KEY} = hashtextextended(l.lease_key, 0)) ORDER BY 1",
        prefix,
    )
    return [r["lease_key"] for r in rows]


@contextlib.asynccontextmanager
async def _migration_lock(conn: Conn) -> AsyncIterator[None]:
    if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_KEY):
        holder = await conn.fetchval(
            f"SELECT pid FROM pg_locks WHERE {_ADVISORY_KEY} = $1", MIGRATION_LOCK_KEY
        )
        log.info("waiting for the schema migration lock (held by backend pid %s)", holder)
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        yield
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


async def apply_migrations(
    conn: Conn, *, allow_breaking: bool = False, migrations: Sequence[Migration] | None = None
) -> list[int]:
    """Check compatibility, then bring the database to this code's schema; returns the versions
    this call applied. Raises `SchemaMismatch` when this code must not run on the schema, or when
    a pending migration is breaking and `allow_breaking` is False (workers: only `fanout migrate`
    applies those). `migrations` replaces the shipped list (tests stand in for other releases)."""
    shipped = list(available_migrations() if migrations is None else migrations)
    async with _migration_lock(conn):
        await _create_bookkeeping(conn)
        state = await read_state(conn)
        check_compatible(state, shipped)
        pending = [m for m in shipped if m.version not in state.applied]
        breaking = [f"{m.version} ({m.name})" for m in pending if m.breaking]
        if breaking and not allow_breaking:
            raise SchemaMismatch(
                f"migration {', '.join(breaking)} is breaking: workers of the previous release cannot"
                " run on it, so no worker applies it; stop every worker, run `fanout migrate"
                " --database-url URL`, then start them all"
            )
        if breaking and (running := await live_workers(conn)):
            raise SchemaMismatch(
                f"migration {', '.join(breaking)} is breaking and workers still run on this database"
                f" ({', '.join(running)}): stop every worker first, then migrate"
            )
        code = code_version(shipped)
        if state.version > code:
            log.info(
                "schema version %d is newer than this code's %d; its compat floor %d allows this code",
                state.version, code, state.floor,
            )  # fmt: skip
        done: list[int] = []
        for migration in pending:
            log.info(
                "applying migration version=%d name=%s breaking=%s",
                migration.version, migration.name, migration.breaking,
            )  # fmt: skip
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_version (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )
                if migration.breaking:
                    await conn.execute(
                        "UPDATE schema_compat SET floor = greatest(floor, $1)", migration.version
                    )
            done.append(migration.version)
        return done


async def migrate_url(database_url: str, *, allow_breaking: bool = False) -> list[int]:
    """Connect, migrate, disconnect."""
    conn = await asyncpg.connect(database_url)
    try:
        return await apply_migrations(conn, allow_breaking=allow_breaking)
    finally:
        await conn.close()
