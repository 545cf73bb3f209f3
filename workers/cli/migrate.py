"""`fanout migrate --database-url URL`: apply the schema migrations (safe to run concurrently)."""

from __future__ import annotations

import argparse
import logging

from workers import event_loop
from workers.storage.migrate import migrate_url


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout migrate", description=__doc__)
    p.add_argument("--database-url", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    applied = event_loop.run(migrate_url(args.database_url))
    print(f"applied: {applied or 'nothing (up to date)'}")
    return 0
