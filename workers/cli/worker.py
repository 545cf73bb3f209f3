"""`fanout worker --config FILE`: run one worker process until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from workers import event_loop
from workers.app import Worker
from workers.config import ConfigError, WorkerConfig, load_config


async def run(config: WorkerConfig) -> int:
    worker = Worker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await worker.start()
        print(f"ready http://{config.http_host}:{worker.http_port}", flush=True)
        await stop.wait()
    finally:
        await worker.stop()
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fanout worker", description="Run one fanout worker process.")
    parser.add_argument("--config", required=True, help="YAML file; FANOUT_* variables override fields")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"fanout: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level,
        format=f"%(asctime)s %(levelname)s [{config.instance_name}] %(name)s %(message)s",
    )
    return event_loop.run(run(config), use_uvloop=config.event_loop == "uvloop")
