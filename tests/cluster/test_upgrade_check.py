"""The upgrade check, short: the previous release (release/previous.toml's commit, built in its own
venv under .cache/upgrade-check, reused once built) as a cluster under load, its workers replaced
one at a time by this tree's, every client keeping its token; then the history check.

`make upgrade-check` runs the same with longer phases (docs/operations.md, "Upgrading"). Cost: the
build once per commit (about a minute of pip on a clean machine: `make test` builds it first, as
`make previous-release`), then 85 to 110 s of cluster on a loaded 2-core machine (five
restarts, each mostly Python starting up; phases of 2 s).
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import Servers
from workers.harness.loadgen import LoadPlan
from workers.harness.upgrade import ORDER, CheckPlan, upgrade_check
from workers.harness.upgrade_build import (
    BuildError,
    build_previous_release,
    lock_changes,
    release_env,
)


@pytest.fixture
async def empty_database(servers: Servers) -> AsyncIterator[str]:
    """A database with no schema at all: the previous release's first worker migrates it."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield await servers.create_database(name, migrated=False)
    await servers.drop_database(name)


async def test_a_rolling_upgrade_from_the_previous_release_under_load(
    empty_database: str, servers: Servers, channel_prefix: str, tmp_path: Path
) -> None:
    release = await asyncio.to_thread(build_previous_release)
    # Its workers run its own code: the venv's `workers`, not this tree's (no PYTHONPATH, own cwd).
    where = await asyncio.to_thread(
        subprocess.run,
        [str(release.venv / "bin" / "python"), "-c", "import workers; print(workers.__file__)"],
        capture_output=True, text=True, env=release_env(), cwd=tmp_path, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(release.venv), where.stdout
    version = release.version
    load = LoadPlan(users=6, rooms=4, rooms_per_user=2, concurrency=4, sync_timeout_ms=500)
    plan = CheckPlan(phase_s=2.0, announce_interval_s=0.2, load=load)

    report = await upgrade_check(
        release, empty_database, servers.redis_url, tmp_path, plan, channel_prefix=channel_prefix
    )

    print(report.render())
    assert report.passed, report.render()
    assert [p.name for p in report.phases] == [
        f"start {version}", "users and rooms", f"load on {version}",
        *(f"replace {name}" for name in ORDER), "drain and check",
    ]  # fmt: skip
    assert report.phases[2].workers == f"5 {version}" and report.phases[-1].workers == "5 HEAD"
    assert report.start_overs == [] and report.clients > 0
    # Events were written on each mix of releases, and every one the readers could see was checked.
    assert all(p.acknowledged > 0 for p in report.phases[2:-1]), report.render()
    assert report.events_checked > sum(p.acknowledged for p in report.phases)


def test_a_previous_commit_missing_from_the_clone_is_one_clear_line(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "previous.toml").write_text(f'version = "0.0.9"\ncommit = "{"ab" * 20}"\n')

    with pytest.raises(BuildError) as refused:
        build_previous_release(tmp_path, cache=tmp_path / "cache", say=lambda _: None)

    message = str(refused.value)
    assert "\n" not in message
    assert "0.0.9" in message and "abababababab" in message and "is not in this clone" in message
    assert not (tmp_path / "cache").exists()


def test_the_lock_comparison_names_what_differs() -> None:
    old = "# pinned\nasyncpg==0.31.0\nredis==8.0.0\nyarl==1.0\n"
    assert lock_changes(old, old) == "the same as HEAD's (3 pins)"
    assert lock_changes(old, "asyncpg==0.32.0\nredis==8.0.0\nuvloop==0.23.0\n") == (
        "3 pins, differing from HEAD's: HEAD adds uvloop; HEAD drops yarl; changed: asyncpg 0.31.0 -> 0.32.0"
    )
