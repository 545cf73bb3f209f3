"""`fanout writers plan OLD NEW`: what changing `stream_writers.events` from OLD to NEW moves.

OLD and NEW are comma-separated instance names in configured order. Read from the cluster's
database (`--config FILE`, a worker's configuration, or `--database-url`): the rooms held by a
writer whose stable choice over NEW is another writer (the reload hands each to it; a writer
that leaves releases all of its rooms), the rooms without a lease whose first writer changes,
and, when the stored streams follow the events writers, the same for their users (rooms, for
receipts): those held by a writer that leaves, and the users without a lease whose first writer
changes. Stored-stream keys held by writers that stay do not move. The procedure is in
docs/operations.md ("Adding, removing and restarting writers").
"""

from __future__ import annotations

import argparse
import sys

import asyncpg

from workers.config import ConfigError, load_config
from workers.process import event_loop
from workers.routing import WriterPlan, plan_writers
from workers.storage import connect


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fanout writers", description=__doc__)
    commands = p.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="what a change of the events writers moves")
    plan.add_argument("old", help="the writers now, comma-separated, in configured order")
    plan.add_argument("new", help="the writers after the change")
    where = plan.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="a worker's configuration file (its database_url is used)")
    where.add_argument("--database-url")
    plan.add_argument("--limit", type=int, default=20, help="rooms and users listed per kind (default 20)")
    return p


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise ValueError(f"a writer is named twice in {text!r}")
    return names


async def _plan(database_url: str, old: list[str], new: list[str]) -> WriterPlan:
    async with connect(database_url) as conn:
        held = await conn.fetch("SELECT room_id, writer FROM room_leases WHERE NOT released")
        unleased = await conn.fetch(
            "SELECT room_id FROM rooms r"
            " WHERE NOT EXISTS (SELECT 1 FROM room_leases l WHERE l.room_id = r.room_id)"
        )
        users = await conn.fetch("SELECT user_id FROM users EXCEPT SELECT entity FROM stream_leases")
        keys = await conn.fetch("SELECT stream, entity, writer FROM stream_leases WHERE NOT released")
    return plan_writers(
        old, new, {r["room_id"]: r["writer"] for r in held}, [r["room_id"] for r in unleased],
        [r["user_id"] for r in users], {(r["stream"], r["entity"]): r["writer"] for r in keys},
    )  # fmt: skip


def describe(plan: WriterPlan, limit: int) -> list[str]:
    lines = [
        f"events writers: {', '.join(plan.old)} -> {', '.join(plan.new)}",
        f"added: {', '.join(plan.added) or 'none'}; removed: {', '.join(plan.removed) or 'none'}",
        f"held rooms that move on reload (to their writer over the new list): {len(plan.rooms_moving)}",
        *(f"  {room} {holder} -> {to}" for room, holder, to in plan.rooms_moving[:limit]),
        f"rooms without a lease whose first writer changes: {len(plan.unleased_moving)}",
        *(f"  {room} {a} -> {b}" for room, a, b in plan.unleased_moving[:limit]),
        "stored streams without writers of their own (they follow the events writers):",
        f"  users (rooms, for receipts) that move when the removed writers stop: {len(plan.keys_moving)}",
        *(f"    {stream} {key} (held by {holder})" for stream, key, holder in plan.keys_moving[:limit]),
        f"  users without a lease whose first writer changes: {len(plan.users_moving)}",
        *(f"    {user} {a} -> {b}" for user, a, b in plan.users_moving[:limit]),
    ]
    return lines


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        old, new = _names(args.old), _names(args.new)
        database_url = args.database_url or load_config(args.config).database_url
        plan = event_loop.run(_plan(database_url, old, new))
    except (ConfigError, ValueError) as e:
        print(f"fanout writers: {e}", file=sys.stderr)
        return 2
    except (OSError, asyncpg.PostgresError) as e:
        print(f"fanout writers: cannot read the database: {e}", file=sys.stderr)
        return 1
    print("\n".join(describe(plan, args.limit)))
    return 0
