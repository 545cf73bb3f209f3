"""`fanout writers plan OLD NEW` against a real database: the rooms a leaving writer holds, the
rooms without a lease whose first writer changes, the users whose stored-stream writer changes;
bad lists exit 2 with one line."""

from __future__ import annotations

import asyncio
import os
import subprocess

import asyncpg

from tests.workers.worker_process import FANOUT
from workers.routing import writer_for_room, writer_for_user


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FANOUT_")}
    return subprocess.run(
        [FANOUT, "writers", "plan", *args], env=env, capture_output=True, text=True, timeout=60
    )


async def test_the_plan_of_a_removed_writer(database_url: str) -> None:
    old, new = ["p1", "p2", "p3"], ["p1", "p2"]
    rooms = [f"!r{i}:hs" for i in range(12)]
    users = [f"@u{i}:hs" for i in range(12)]
    conn = await asyncpg.connect(database_url)
    try:
        await conn.executemany(
            "INSERT INTO rooms (room_id, room_version) VALUES ($1, '10')",
            [(r,) for r in [*rooms, "!held:hs"]],
        )
        await conn.executemany(
            "INSERT INTO users (user_id, created_ts) VALUES ($1, 0)", [(u,) for u in users]
        )
        await conn.execute("INSERT INTO room_leases (room_id, writer, epoch) VALUES ('!held:hs', 'p3', 1)")
        await conn.execute(
            "INSERT INTO stream_leases (stream, entity, writer, epoch) VALUES ('to_device', $1, 'p3', 1)",
            users[0],
        )
    finally:
        await conn.close()
    done = await asyncio.to_thread(_plan, ",".join(old), ",".join(new), "--database-url", database_url)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "events writers: p1, p2, p3 -> p1, p2" in out
    assert "added: none; removed: p3" in out
    to = writer_for_room("!held:hs", new)
    heading = "held rooms that move on reload (to their writer over the new list)"
    assert f"{heading}: 1\n  !held:hs p3 -> {to}" in out
    moving = [r for r in rooms if writer_for_room(r, old) != writer_for_room(r, new)]
    assert f"rooms without a lease whose first writer changes: {len(moving)}" in out
    assert all(f"  {r} {writer_for_room(r, old)} -> {writer_for_room(r, new)}" in out for r in moving)
    assert f"move when the removed writers stop: 1\n    to_device {users[0]} (held by p3)" in out
    changed = [u for u in users[1:] if writer_for_user(u, old, "x") != writer_for_user(u, new, "x")]
    assert f"users without a lease whose first writer changes: {len(changed)}" in out


def test_a_bad_writer_list_exits_2(database_url: str) -> None:
    done = _plan("p1,p1", "p1", "--database-url", database_url)
    assert done.returncode == 2
    assert done.stderr.strip() == "fanout writers: a writer is named twice in 'p1,p1'"
