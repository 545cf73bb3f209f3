"""Backup and restore of the database, command for command as docs/operations.md gives them.

`procedure()` (dump and restore) and `archiving()` with `RECOVER` (point-in-time recovery) are the
documented commands, as argument lists or shell lines; tests/cluster/test_restore.py runs them and
checks that each, rendered with the documentation's placeholders, is a line of the docs. The
client binaries are PostgreSQL's own: `pg_dump` refuses a server of a newer major version, so they
come from the same installation as the server (`workers.embedded.services.postgres_bin_dir`:
pgserver's bundled 16 by default; Debian's 15 client on PATH is too old for it).

Why the sequences move forward after the restore: clients and the old cluster's readers hold tokens
up to what the old cluster handed out, which is past the dump. Were the restored sequences to hand
those IDs out again, a client whose token covers an ID would never be sent the new event that
reused it. `ADVANCE_SQL` moves every stream sequence `gap` past its restored value, so every ID
handed out after the restore is above every token issued before it (the gap must exceed the IDs
handed out between the dump and the old cluster's stop; the default covers a billion). The caches
stream's workers keep no `stream_positions` rows: a worker starts it at its table's highest ID, or
at a row of the stream there (`idgen.startup`). `MARK_CACHES_SQL` writes that row at the moved
sequence. Without it, every client holding a token from before the restore was answered "nothing
new" with its own token until some worker wrote a caches row.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from workers.embedded.services import Source, postgres_bin_dir
from workers.errors import WorkerError

#: How far past its restored value each stream sequence moves (see the module docstring).
DEFAULT_GAP = 1_000_000_000

#: Moves every stream sequence (`*stream_seq`) `gap` past its restored value; prints each.
ADVANCE_SQL = (
    "SELECT c.relname, setval(c.oid, coalesce(pg_sequence_last_value(c.oid), 0) + {gap})"
    " FROM pg_class c WHERE c.relkind = 'S' AND c.relname LIKE '%stream_seq' ORDER BY 1"
)

#: The caches stream's start at its moved sequence: its workers keep no `stream_positions` rows and
#: start it at its table's highest ID (the dump's, behind the tokens clients hold), or at this row.
MARK_CACHES_SQL = (
    "INSERT INTO stream_positions (stream_name, instance_name, stream_id)"
    " SELECT 'caches', 'restore', last_value FROM cache_invalidation_stream_seq"
    " ON CONFLICT (stream_name, instance_name) DO UPDATE SET stream_id = EXCLUDED.stream_id"
)


class BackupError(WorkerError):
    """A backup or restore command failed; the message holds the command and its stderr."""


@dataclass(frozen=True)
class Step:
    """One command of the procedure: what it is for, and its arguments (the program first, by name)."""

    purpose: str
    argv: tuple[str, ...]


def procedure(
    database_url: str,
    backup: str,
    admin_url: str,
    restored_name: str,
    restored_url: str,
    gap: int = DEFAULT_GAP,
) -> dict[str, list[Step]]:
    """The commands, by phase: `backup` (while the cluster runs) and `restore` (cluster stopped)."""
    return {
        "backup": [Step("dump", ("pg_dump", "--format=custom", "--file", backup, database_url))],
        "restore": [
            Step(
                "create",
                ("psql", admin_url, "-v", "ON_ERROR_STOP=1", "-c", f"CREATE DATABASE {restored_name}"),
            ),
            Step(
                "restore", ("pg_restore", "--exit-on-error", "--no-owner", "--dbname", restored_url, backup)
            ),
            Step(
                "advance", ("psql", restored_url, "-v", "ON_ERROR_STOP=1", "-c", ADVANCE_SQL.format(gap=gap))
            ),
            Step("mark", ("psql", restored_url, "-v", "ON_ERROR_STOP=1", "-c", MARK_CACHES_SQL)),
        ],
    }


def archiving(database_url: str, wal_dir: str, base_dir: str) -> dict[str, list[Step]]:
    """Point-in-time recovery: turn WAL archiving on into `wal_dir` (then restart the server), and
    take a base backup into `base_dir`. Recovering is `RECOVER`."""
    archive_command = f"test ! -f {wal_dir}/%f && cp %p {wal_dir}/%f"
    return {
        "archive": [
            Step("archive", ("psql", database_url, "-v", "ON_ERROR_STOP=1",
                             "-c", "ALTER SYSTEM SET archive_mode = on",
                             "-c", f"ALTER SYSTEM SET archive_command = '{archive_command}'")),
        ],
        "base_backup": [
            Step("base backup", ("pg_basebackup", "--dbname", database_url, "--pgdata", base_dir,
                                 "--wal-method=stream", "--checkpoint=fast")),
        ],
    }  # fmt: skip


#: Recovery to time `$T` from the base backup `$BASE` and the archive `$WAL`, into the stopped
#: server's data directory `$PGDATA`: shell lines, run by the server's user.
RECOVER = (
    'rm -rf "$PGDATA" && cp -a "$BASE" "$PGDATA"',
    'touch "$PGDATA/recovery.signal"',
    "printf \"restore_command = 'cp $WAL/%%f %%p'\\nrecovery_target_time = '%s'\\n"
    'recovery_target_action = \'promote\'\\n" "$T" >> "$PGDATA/postgresql.auto.conf"',
)


def shell_line(argv: Sequence[str]) -> str:
    """`argv` as one shell line as the docs print it: an argument holding a `$NAME` placeholder,
    a quote or a space in double quotes (the shell expands the placeholder), others as they are."""
    return " ".join(_quote(a) for a in argv)


def _quote(arg: str) -> str:
    if any(c in arg for c in "$' %&") and not any(c in arg for c in '"`\\'):
        return f'"{arg}"'
    return shlex.quote(arg)


async def run(steps: Sequence[Step], source: Source = "embedded") -> list[str]:
    """Run `steps` in order with the client binaries of `source`; each one's stdout. Never blocks
    the event loop (a load may be running beside a backup)."""
    bin_dir = postgres_bin_dir(source)
    outputs = []
    for step in steps:
        argv = [str(bin_dir / step.argv[0]), *step.argv[1:]]
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        out, err = await process.communicate()
        if process.returncode != 0:
            raise BackupError(
                f"{step.purpose}: {shell_line(step.argv)} exited {process.returncode}: "
                f"{err.decode(errors='replace').strip()}"
            )
        outputs.append(out.decode(errors="replace"))
    return outputs


async def run_shell(lines: Sequence[str], env: dict[str, str]) -> None:
    """Run each of `lines` with bash, `env` added to the environment (the placeholders' values)."""
    for line in lines:
        process = await asyncio.create_subprocess_exec(
            "bash", "-c", line, env={**os.environ, **env}, stderr=asyncio.subprocess.PIPE
        )
        _out, err = await process.communicate()
        if process.returncode != 0:
            raise BackupError(f"{line} exited {process.returncode}: {err.decode(errors='replace').strip()}")
