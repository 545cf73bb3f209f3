"""One process per instance name, with real worker processes: a second one exits 1 naming the
holder; a holder frozen (SIGSTOP) past its lease loses the name to a new process and, once
resumed, exits 1 without serving again, and a write it had in flight does not commit."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from tests.workers.worker_process import FANOUT, start_worker, until_blocked_on_lock
from workers.embedded.services import free_port
from workers.harness.cluster import LOOPBACK
from workers.harness.cluster_client import ClusterClient


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


async def test_a_write_pending_when_the_holder_lost_its_name_does_not_commit(
    database_url: str, redis_url: str, channel_prefix: str, tmp_path: Path
) -> None:
    """The write is held inside its transaction (a table lock the test holds) while the persister
    is frozen past its lease and a new process takes the name; resumed, its commit must fail on
    the epoch check, and the event must not be stored."""
    config = {
        **_config(database_url, redis_url, channel_prefix),
        "registration": "open",
        "worker_secret": "test-worker-secret-0123456789",
        "rc_exempt_addresses": LOOPBACK,
    }
    first_url = f"http://127.0.0.1:{(first_port := free_port())}"
    first = await asyncio.to_thread(start_worker, {**config, "http_port": first_port}, tmp_path / "a.yaml")
    second = None
    admin = await asyncpg.connect(database_url)
    marker = f"pending-{uuid.uuid4().hex}"
    try:
        async with aiohttp.ClientSession() as session:
            alice = ClusterClient(session, {"w1": first_url})
            await alice.register("alice")
            room = await alice.create_room()
            lock = admin.transaction()
            await lock.start()
            await admin.execute("LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE")
            send = asyncio.create_task(alice.send(room, "m.room.message", {"body": marker}))
            await until_blocked_on_lock(admin)
            first.send_signal(signal.SIGSTOP)
            await asyncio.sleep(config["instance_lease_s"] + 1)
            second = await asyncio.to_thread(
                start_worker, {**config, "http_port": free_port()}, tmp_path / "b.yaml"
            )
            await lock.rollback()  # the frozen holder's insert runs; its check and COMMIT wait
            first.send_signal(signal.SIGCONT)
            outcome = await asyncio.gather(send, return_exceptions=True)
            assert not isinstance(outcome[0], dict), outcome  # never answered 200
        assert await asyncio.to_thread(first.wait, 30) == 1
        assert first.stderr is not None
        stderr = first.stderr.read()
        assert "is no longer held by this process" in stderr
        assert "Traceback" not in stderr
        stored = await admin.fetchval("SELECT count(*) FROM events WHERE json LIKE $1", f"%{marker}%")
        assert stored == 0
        assert second.poll() is None
    finally:
        await admin.close()
        first.send_signal(signal.SIGCONT)
        first.kill()
        if second is not None:
            second.terminate()
            await asyncio.to_thread(second.wait, 30)
