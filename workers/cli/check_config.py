"""`fanout check-config PATH`: validate worker configuration and print what it resolves to.

A file: the configuration resolved (env applied), with the password of every URL replaced by '***'.
A directory: every `*.yaml` / `*.yml` in it is validated, and the cluster's PostgreSQL connection
budget is printed (`workers.process.connection_budget`); with `--max-connections N` the budget is checked
against the server's limit, and with `--max-client-conn N` the pools that go through PgBouncer
(`database_pooler: transaction`) against its client limit. Exit 2 when a file is invalid or the
budget does not fit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workers.config import ConfigError, load_config
from workers.process.connection_budget import DEFAULT_HEADROOM, PGBOUNCER_DEFAULT_POOL, Budget, WorkerShare
from workers.process.redact import redact


def _replicas(values: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        name, _, count = value.partition("=")
        if not name or not count.isdigit() or int(count) < 1:
            raise ConfigError(f"--replicas {value!r}: give FILE=N (the file's name, N >= 1)")
        out[name] = int(count)
    return out


def budget_of(
    directory: Path,
    replicas: dict[str, int],
    audit_partitions: int,
    headroom: int,
    pooler_pool: int = PGBOUNCER_DEFAULT_POOL,
) -> Budget:
    """The budget of every configuration in `directory`; ConfigError naming the first bad file."""
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise ConfigError(f"{directory} holds no *.yaml worker configuration")
    unknown = set(replicas) - {p.name for p in files} - {p.stem for p in files}
    if unknown:
        raise ConfigError(f"--replicas names no file in {directory}: {', '.join(sorted(unknown))}")
    budget = Budget(audit_partitions=audit_partitions, headroom=headroom, pooler_pool=pooler_pool)
    for path in files:
        config = load_config(path)
        count = replicas.get(path.name, replicas.get(path.stem, 1))
        pooled = config.database_pooler == "transaction"
        budget.workers.append(WorkerShare(path.name, config.db_pool_size, count, pooled))
    return budget


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout check-config", description=__doc__)
    p.add_argument("config", help="a YAML file, or a directory of them (FANOUT_* variables override fields)")
    p.add_argument("--max-connections", type=int, help="directory: PostgreSQL's max_connections to check")
    p.add_argument("--audit-partitions", type=int, default=0, help="directory: the audit's JDBC partitions")
    p.add_argument(
        "--headroom", type=int, default=DEFAULT_HEADROOM, help="directory: reserved and operator sessions"
    )
    p.add_argument("--pgbouncer-pool", type=int, default=PGBOUNCER_DEFAULT_POOL,
                   help="directory: PgBouncer's default_pool_size + reserve_pool_size (counted when"
                   " a configuration has database_pooler: transaction)")  # fmt: skip
    p.add_argument("--max-client-conn", type=int, help="directory: PgBouncer's max_client_conn to check")
    p.add_argument("--replicas", action="append", default=[], metavar="FILE=N",
                   help="directory: N processes run FILE (e.g. sync.yaml=4); repeatable")  # fmt: skip
    args = p.parse_args(argv)
    path = Path(args.config)
    try:
        if not path.is_dir():
            config = load_config(path)
            print(json.dumps(redact(config.model_dump(mode="json")), indent=2))
            return 0
        budget = budget_of(
            path, _replicas(args.replicas), args.audit_partitions, args.headroom, args.pgbouncer_pool
        )
    except ConfigError as e:
        print(f"fanout: {e}", file=sys.stderr)
        return 2
    print(f"PostgreSQL connection budget of {path}:")
    for line in budget.lines():
        print(f"  {line}")
    if args.max_connections is not None:
        if not budget.fits(args.max_connections):
            print(
                f"fanout: the budget ({budget.total}) exceeds max_connections={args.max_connections}:"
                " lower db_pool_size or raise max_connections",
                file=sys.stderr,
            )
            return 2
        print(f"fits max_connections={args.max_connections} ({args.max_connections - budget.total} to spare)")
    if args.max_client_conn is not None and budget.pooled:
        if not budget.pooler_fits(args.max_client_conn):
            print(
                f"fanout: the pools through PgBouncer ({budget.pooler_clients}) exceed max_client_conn="
                f"{args.max_client_conn}: lower db_pool_size or raise PgBouncer's max_client_conn",
                file=sys.stderr,
            )
            return 2
        spare = args.max_client_conn - budget.pooler_clients
        print(f"fits PgBouncer's max_client_conn={args.max_client_conn} ({spare} to spare)")
    return 0
