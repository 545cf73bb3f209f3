"""One process per instance name, with real worker processes: a second one exits 1 naming the
holder; a holder frozen (SIGSTOP) past its lease loses the name to a new process and, once
resumed, exits 1 without serving again."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.workers.worker_process import FANOUT, start_worker


def _config(database_url: str, redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "instance_name": "w1",
        "database_url": database_url,
        "redis_url": redis_url,
        "channel_prefix": prefix,
        "stream_writers": {"events": ["w1"]},
        "http_port": 0,
        "startup_retry_s": 1,
        "instance_lease_s": 2,
        "position_announce_interval_s": 0.2,
        "event_loop": "asyncio",
    }


def _run_second(path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    return subprocess.run(
        [FANOUT, "worker", "--config", str(path)], env=env, capture_output=True, text=True, timeout=60
    )


async def test_a_second_process_with_a_held_name_exits_1_naming_the_holder(
    database_url: str, redis_url: str, channel_prefix: str, tmp_path: Path
) -> None:
    config = _config(database_url, redis_url, channel_prefix)
    first = await asyncio.to_thread(start_worker, config, tmp_path / "a.yaml")
    try:
        second = await asyncio.to_thread(_run_second, tmp_path / "a.yaml")
        assert second.returncode == 1, second.stderr
        assert "Traceback" not in second.stderr
        assert (
            f"instance name 'w1' (prefix '{channel_prefix}') is held by pid {first.pid} on " in second.stderr
        )
        assert first.poll() is None
    finally:
        first.terminate()
        await asyncio.to_thread(first.wait, 30)
    assert first.returncode == 0
    # Released on a clean stop: the name is free again.
    again = await asyncio.to_thread(start_worker, config, tmp_path / "a.yaml")
    again.terminate()
    await asyncio.to_thread(again.wait, 30)


async def test_a_frozen_holder_loses_the_name_and_exits_1_when_resumed(
    database_url: str, redis_url: str, channel_prefix: str, tmp_path: Path
) -> None:
    config = _config(database_url, redis_url, channel_prefix)
    first = await asyncio.to_thread(start_worker, config, tmp_path / "a.yaml")
    second = None
    try:
        first.send_signal(signal.SIGSTOP)
        await asyncio.sleep(config["instance_lease_s"] + 2)
        started = time.monotonic()
        second = await asyncio.to_thread(start_worker, config, tmp_path / "b.yaml")
        assert time.monotonic() - started < 30
        first.send_signal(signal.SIGCONT)
        code = await asyncio.to_thread(first.wait, 30)
        assert first.stderr is not None
        stderr = first.stderr.read()
        assert code == 1, stderr
        assert "Traceback" not in stderr
        assert "fanout: lost instance name 'w1'" in stderr
        assert second.poll() is None
    finally:
        first.send_signal(signal.SIGCONT)
        first.kill()
        if second is not None:
            second.terminate()
            await asyncio.to_thread(second.wait, 30)
