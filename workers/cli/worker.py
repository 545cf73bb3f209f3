"""`fanout worker --config FILE`: run one worker process until SIGTERM or SIGINT; SIGHUP reads
FILE again and applies the writers and the instance map it names (`workers.assembly.reload`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from workers.app import Worker
from workers.config import WorkerConfig, load_config
from workers.process import event_loop
from workers.process.log_format import configure_logging
from workers.process.shutdown import HARD_EXIT_MARGIN_S, exit_abandoning, exit_anyway
from workers.process.startup_errors import describe


async def run(config: WorkerConfig, path: str | None = None) -> int:
    """Start, serve until a signal, stop; a failed start stops what started and re-raises."""
    worker = Worker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if path is not None:
        loop.add_signal_handler(signal.SIGHUP, worker.live_writers.reload, path)
    try:
        await worker.start()
        ready = f"ready http://{config.http_host}:{worker.http_port}"
        if config.log_format == "json":  # every line a JSON record, this one too
            ready = json.dumps({"level": "INFO", "instance": config.instance_name, "message": ready})
        print(ready, flush=True)
        stopped = asyncio.create_task(stop.wait())
        lost = asyncio.create_task(worker.lease_lost.wait())
        await asyncio.wait([stopped, lost], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        lost.cancel()
    finally:
        # Should the loop itself be stuck, the process still ends (an orchestrator would kill it).
        exit_anyway(config.shutdown_timeout_s + HARD_EXIT_MARGIN_S, "the shutdown")
        outcome = await worker.stop()
    if worker.lease_lost.is_set():
        print(f"fanout: lost instance name {config.instance_name!r} (frozen or cut off from PostgreSQL"
              f" for over {config.instance_lease_s:g}s); exiting", file=sys.stderr)  # fmt: skip
        return 1
    if not outcome.clean:
        print(f"fanout: stopped within {config.shutdown_timeout_s:g}s but not cleanly ({outcome.describe()});"
              " exiting 1", file=sys.stderr)  # fmt: skip
        exit_abandoning(1)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fanout worker", description="Run one fanout worker process.")
    parser.add_argument("--config", required=True, help="YAML file; FANOUT_* variables override fields")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        configure_logging(config)
        return event_loop.run(run(config, args.config), use_uvloop=config.event_loop == "uvloop")
    except Exception as e:
        failure = describe(e)
        if failure is None:
            raise
        line, code = failure
        print(line, file=sys.stderr)
        return code
