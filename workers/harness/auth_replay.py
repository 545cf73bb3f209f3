"""Replay rooms' stored events through the Matrix authorization rules: every live event (positive
stream ordering) of each room, in stream order, as PostgreSQL holds them. Two judges, neither
sharing code with the worker's own rules: the spec's rules as written here
(`workers.harness.auth_rules`, `replay_stored`), and Synapse's own `synapse.event_auth`, run in
Synapse's virtualenv by `workers/harness/synapse_auth_judge.py` (`judge_with_synapse`).
Harness only: a worker never imports it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from workers.harness.auth_rules import ReplayResult, StoredEvent, replay
from workers.harness.bench.peer.synapse_build import build_synapse
from workers.harness.upgrade_build import Say
from workers.storage import Conn, connect

_EVENTS = (
    "SELECT stream_ordering, event_id, room_id, type, state_key, sender, json FROM events"
    " WHERE stream_ordering > 0{rooms} ORDER BY room_id, stream_ordering"
)
_JUDGE = Path(__file__).with_name("synapse_auth_judge.py")


def _quiet(line: str) -> None:
    pass


@dataclass(frozen=True, slots=True)
class SynapseVerdict:
    """What Synapse's rules said of the stored rooms: each refusal names the stored event and why."""

    events: int
    rooms: int
    refused: tuple[dict[str, Any], ...]

    def __str__(self) -> str:
        head = f"Synapse's event_auth: {self.events:,} stored events of {self.rooms} rooms"
        refusals = [f"  {r['event_id']} ({r['type']}, {r['room_id']}): {r['reason']}" for r in self.refused]
        return "\n".join([f"{head}, {len(self.refused)} refused", *refusals[:20]])

    def problems(self) -> list[str]:
        """One line per refusal, for a load's list of problems."""
        return [f"refused by Synapse's event_auth: {r['event_id']} ({r['type']}, {r['room_id']}):"
                f" {r['reason']}" for r in self.refused]  # fmt: skip


async def _records(conn: Conn, room_ids: Collection[str] | None) -> list[asyncpg.Record]:
    if room_ids is None:
        return list(await conn.fetch(_EVENTS.format(rooms="")))
    return list(await conn.fetch(_EVENTS.format(rooms=" AND room_id = ANY($1::text[])"), list(room_ids)))


def _content(stored: dict[str, Any]) -> dict[str, Any]:
    content = stored.get("content")
    return content if isinstance(content, dict) else {}


async def replay_stored(conn: Conn, room_ids: Collection[str] | None = None) -> ReplayResult:
    """Judge the stored live events of `room_ids` (None: every room) against the spec's rules."""
    events = [
        StoredEvent(r["stream_ordering"], r["event_id"], r["room_id"], r["type"], r["sender"],
                    _content(json.loads(r["json"])), r["state_key"])
        for r in await _records(conn, room_ids)
    ]  # fmt: skip
    return replay(events)


async def replay_database(database_url: str, room_ids: Collection[str] | None = None) -> ReplayResult:
    """`replay_stored` on a connection of its own."""
    async with connect(database_url) as conn:
        return await replay_stored(conn, room_ids)


def _rooms_for_synapse(records: Sequence[asyncpg.Record]) -> list[dict[str, Any]]:
    rooms: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        stored = json.loads(r["json"])
        rooms.setdefault(r["room_id"], []).append({
            "stream_ordering": r["stream_ordering"], "event_id": r["event_id"], "type": r["type"],
            "sender": r["sender"], "state_key": r["state_key"], "content": _content(stored),
            "origin_server_ts": stored.get("origin_server_ts", 0),
        })  # fmt: skip
    return [{"room_id": room_id, "events": events} for room_id, events in rooms.items()]


async def judge_with_synapse(
    database_url: str, synapse_python: Path, room_ids: Collection[str] | None = None
) -> SynapseVerdict:
    """The stored live events of `room_ids` (None: every room) judged by Synapse's `event_auth`,
    run by `synapse_python` (the interpreter of Synapse's virtualenv, `fanout bench peer
    --build-only` builds it)."""
    async with connect(database_url) as conn:
        rooms = _rooms_for_synapse(await _records(conn, room_ids))
    return await run_synapse_judge(synapse_python, rooms)


async def judge_with_built_synapse(
    database_url: str, room_ids: Collection[str] | None = None, say: Say = _quiet
) -> SynapseVerdict:
    """`judge_with_synapse` in Synapse's virtualenv, built first if it is not (about a minute, with
    progress to `say`); BuildError if it cannot be built."""
    synapse = await asyncio.to_thread(build_synapse, say=say)
    return await judge_with_synapse(database_url, synapse.python, room_ids)


async def run_synapse_judge(synapse_python: Path, rooms: list[dict[str, Any]]) -> SynapseVerdict:
    """`synapse_auth_judge.py` over `rooms` (its input format); RuntimeError with the judge's last
    line if it fails."""
    process = await asyncio.create_subprocess_exec(
        str(synapse_python), str(_JUDGE), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate(json.dumps(rooms).encode())
    if process.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(
            f"Synapse's auth judge ({synapse_python}) failed (exit {process.returncode}): {last}"
        )
    answer = json.loads(out)
    return SynapseVerdict(answer["events"], answer["rooms"], tuple(answer["refused"]))
