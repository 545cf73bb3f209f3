"""`fanout registration-token {create,list,delete}`: the registration tokens of a cluster
(`registration: token`), straight in its database, for an operator without an admin account.

The database comes from `--config FILE` (a worker's configuration, FANOUT_* applied) or
`--database-url`. `create` prints the new token as JSON, `list` one JSON object a line.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workers.config import ConfigError, load_config
from workers.process import event_loop
from workers.storage import connect
from workers.storage import registration_tokens as tokens


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fanout registration-token", description=__doc__)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="a worker's config (its database_direct_url, else database_url)")
    where.add_argument("--database-url")
    commands = p.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create", help="make a token")
    create.add_argument("--token", help="its text (default: random)")
    create.add_argument("--length", type=int, default=16, help="length of a random token (1 to 64)")
    create.add_argument("--uses-allowed", type=int, help="registrations it allows (default: any number)")
    create.add_argument("--expiry-time", type=int, help="when it stops working, ms since the epoch")
    listing = commands.add_parser("list", help="every token, with its uses")
    listing.add_argument("--valid", choices=["true", "false"], help="only the (in)valid ones")
    delete = commands.add_parser("delete", help="remove a token")
    delete.add_argument("token")
    return p


async def _run(database_url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    async with connect(database_url) as conn:
        if args.command == "create":
            if args.token is not None:
                token = tokens.check_token_name(args.token)
            elif 1 <= args.length <= tokens.MAX_TOKEN_LENGTH:
                token = tokens.random_token(args.length)
            else:
                raise ValueError(f"--length must be from 1 to {tokens.MAX_TOKEN_LENGTH}")
            uses = tokens.check_uses_allowed(args.uses_allowed)
            expiry = tokens.check_expiry_time(args.expiry_time)
            return [(await tokens.create(conn, token, uses, expiry)).as_json()]
        if args.command == "list":
            valid = None if args.valid is None else args.valid == "true"
            return [t.as_json() for t in await tokens.list_tokens(conn, valid)]
        if not await tokens.delete(conn, args.token):
            raise ValueError(f"no registration token {args.token!r}")
        return []


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        database_url = args.database_url or load_config(args.config).session_database_url
        for token in event_loop.run(_run(database_url, args)):
            print(json.dumps(token))
    except (ConfigError, ValueError, tokens.TokenExistsError) as e:
        print(f"fanout registration-token: {e}", file=sys.stderr)
        return 2
    return 0
