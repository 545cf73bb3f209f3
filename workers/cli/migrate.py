"""`fanout migrate --database-url URL`: apply the schema migrations (safe to run concurrently).

Unlike a worker's start-up, this applies breaking migrations too (those that raise the schema's
compat floor), once no worker holds its instance name on the database. `--status` only prints the
schema's version and floor beside this code's. Exit 2 with one line when this code must not run on
the database (`workers.storage.migrate.SchemaMismatch`).
"""

from __future__ import annotations

import argparse
import logging
import sys

import asyncpg

from workers.process import event_loop
from workers.storage.migrate import (
    SchemaMismatch,
    available_migrations,
    code_version,
    migrate_url,
    package_version,
    read_state,
)


async def status(database_url: str) -> str:
    """One line: the schema's version and floor, this code's version, what is pending."""
    conn = await asyncpg.connect(database_url)
    try:
        state = await read_state(conn)
    finally:
        await conn.close()
    shipped = available_migrations()
    pending = [
        f"{m.version}{' (breaking)' if m.breaking else ''}" for m in shipped if m.version not in state.applied
    ]
    return (
        f"schema version {state.version}, compat floor {state.floor}; this code: schema version"
        f" {code_version(shipped)} (fanout {package_version()}); pending: {', '.join(pending) or 'none'}"
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout migrate", description=__doc__)
    p.add_argument("--database-url", required=True)
    p.add_argument("--status", action="store_true", help="print the schema's state; change nothing")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.status:
        print(event_loop.run(status(args.database_url)))
        return 0
    try:
        applied = event_loop.run(migrate_url(args.database_url, allow_breaking=True))
    except SchemaMismatch as e:
        print(f"fanout: {e}", file=sys.stderr)
        return 2
    print(f"applied: {applied or 'nothing (up to date)'}")
    return 0
