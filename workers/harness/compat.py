"""Record this release's replication lines and sync tokens, for the next release's compatibility
tests: `python -m workers.harness.compat --out tests/compat [--database-url URL --redis-url URL]`.

A release is compatible with the previous one when its readers take the previous release's lines
and its /sync takes the previous release's `next_batch` tokens (docs/operations.md, "Upgrading").
This records both from a real run: a local cluster (two persisters, one sync worker; embedded
servers unless URLs are given) with a subscriber on its channels from before the first worker
starts, and a scripted session that writes to every stream and syncs between steps. It writes

* `wire/streams/<stream>.lines`: every RDATA and POSITION line of the stream, in the order heard;
* `wire/channels.json`: the channel each stream's lines came on, less the prefix (`""`: the
  prefix itself; `"/typing"`: the stream's own channel);
* `wire/cluster.lines`: the other commands (REPLICATE, USER_SYNC, CLEAR_USER_SYNC);
* `tokens.json`: the release, its sync token's stream order, the `instance_map` rows the tokens
  refer to and each sync's `next_batch`, with the step it followed.

Every stream a reading worker reports in /health (the streams it follows, the generators it holds),
and typing and presence, must have sent a row, or the recording fails: a new stream extends
the session here, and its lines become one more file. Run it when a release is
cut (CHANGELOG.md) and commit the files; tests/compat replays them against HEAD.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from pubsub.errors import WireError
from pubsub.wire import Position, RData, parse_line
from workers.embedded.services import given_or_embedded
from workers.handlers.sync.handler import SYNC_STREAMS
from workers.harness.cluster import LocalCluster
from workers.harness.cluster_client import ClusterClient
from workers.storage import connect
from workers.storage.migrate import migrate_url

PERSISTERS = ["persister1", "persister2"]
STREAM_WRITERS = {
    "typing": ["persister1"],
    "presence": ["persister1"],
    "account_data": PERSISTERS,
    "device_lists": PERSISTERS,
    "to_device": PERSISTERS,
}


class Recording:
    """The lines heard on the cluster's channels, and the tokens the session's syncs returned."""

    def __init__(self) -> None:
        self.streams: dict[str, list[str]] = {}
        #: Per stream, the channels its lines came on, as suffixes of the prefix ("" or "/<stream>").
        self.channels: dict[str, set[str]] = {}
        self.cluster: list[str] = []
        self.tokens: list[dict[str, str]] = []

    def with_rows(self) -> set[str]:
        """The streams an RDATA line was heard of (every stream announces positions anyway)."""
        return {s for s, lines in self.streams.items() if any(line.startswith("RDATA ") for line in lines)}

    def hear(self, channel: str, data: bytes) -> None:
        """File one received message by its stream; a line this release cannot parse is a bug."""
        try:
            cmd = parse_line(data)
        except WireError as e:
            raise RuntimeError(f"the cluster sent a line its own parser refuses ({e}): {data[:120]!r}") from e
        line = data.decode()
        if isinstance(cmd, RData | Position):
            self.streams.setdefault(cmd.stream, []).append(line)
            self.channels.setdefault(cmd.stream, set()).add(channel)
        else:
            self.cluster.append(line)


async def _listen(redis_url: str, prefix: str, recording: Recording, subscribed: asyncio.Event) -> None:
    """Every message on the cluster's channels, with its channel (less the prefix)."""
    client = aioredis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    try:
        await pubsub.psubscribe(f"{prefix}*")
        subscribed.set()
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None and message["type"] == "pmessage":
                recording.hear(message["channel"].decode()[len(prefix) :], message["data"])
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.aclose()


async def _session(urls: dict[str, str], session: aiohttp.ClientSession, recording: Recording) -> None:
    """Touch every stream: events (messages, state, membership), backfill, caches (every write
    invalidates), typing, presence, account data and tags, device keys, to-device, receipts; sync between
    steps through both reading workers (a persister serves reads too), keeping each token."""
    alice = ClusterClient(session, urls)
    bob = ClusterClient(session, urls)
    await alice.register(f"alice{uuid.uuid4().hex[:6]}", via="sync1")
    await bob.register(f"bob{uuid.uuid4().hex[:6]}", via="sync1")
    since: dict[str, str | None] = {"sync1": None, "persister2": None}

    async def step(name: str, action: Callable[[], Awaitable[Any]]) -> None:
        await action()
        await asyncio.sleep(0.3)
        for via in since:
            body = await alice.sync(via=via, since=since[via])
            since[via] = body["next_batch"]
            recording.tokens.append({"after": name, "via": via, "next_batch": body["next_batch"]})

    room: dict[str, str] = {}

    async def create() -> None:
        room["id"] = await alice.create_room(via="persister1")

    await step("initial sync", lambda: asyncio.sleep(0))
    await step("create a room", create)
    await step("a join", lambda: bob.membership(room["id"], "join", via="persister2"))
    await step("messages from both writers", lambda: asyncio.gather(
        alice.send(room["id"], "m.room.message", {"msgtype": "m.text", "body": "one"}, via="persister1"),
        bob.send(room["id"], "m.room.message", {"msgtype": "m.text", "body": "two"}, via="persister2"),
    ))  # fmt: skip
    await step("a state event", lambda: alice.set_state(room["id"], "m.room.topic", "", {"topic": "t"}))
    await step("backfill", lambda: alice.backfill(
        room["id"], [{"type": "m.room.message", "content": {"msgtype": "m.text", "body": "old"}}]
    ))  # fmt: skip
    await step("typing", lambda: alice.typing(room["id"], True, 30_000, via="persister1"))
    await step("presence", lambda: alice.set_presence("online", "here", via="persister1"))
    await step("account data", lambda: asyncio.gather(
        alice.put_account_data("org.example.settings", {"a": 1}),
        alice.put_account_data("org.example.room", {"b": 2}, room_id=room["id"]),
        alice.set_tag(room["id"], "m.favourite", {"order": 0.5}),
    ))  # fmt: skip
    await step("device keys", lambda: bob.upload_keys({
        "algorithms": ["m.olm.v1.curve25519-aes-sha2"],
        "keys": {f"curve25519:{bob.device_id}": "AAAA", f"ed25519:{bob.device_id}": "BBBB"},
        "signatures": {},
    }))  # fmt: skip
    await step("to-device", lambda: bob.send_to_device(
        "org.example.ping", {str(alice.user_id): {"*": {"n": 1}}}
    ))  # fmt: skip

    async def receipts() -> None:
        sent = await alice.send(room["id"], "m.room.message", {"msgtype": "m.text", "body": "read"})
        await bob.receipt(room["id"], sent["event_id"], "m.read", via="sync1")
        await bob.receipt(room["id"], sent["event_id"], "m.read.private", via="persister2")

    await step("receipts", receipts)
    await step("an invite, a knock room and a leave", lambda: asyncio.gather(
        bob.membership(room["id"], "leave"),
        alice.create_room("invite", initial_state=[
            {"type": "m.room.join_rules", "content": {"join_rule": "knock"}}
        ], invite=[str(bob.user_id)]),
    ))  # fmt: skip


async def record(database_url: str, redis_url: str, out: Path, workdir: Path) -> Recording:
    """Run the cluster and the session; write the files under `out` (replacing `out/wire`)."""
    await migrate_url(database_url)
    prefix = f"compat-{uuid.uuid4().hex[:8]}"
    recording = Recording()
    subscribed = asyncio.Event()
    listener = asyncio.create_task(_listen(redis_url, prefix, recording, subscribed))
    await asyncio.wait_for(subscribed.wait(), 10)
    cluster = LocalCluster(
        database_url, redis_url, workdir, persisters=2, sync_workers=1, background_workers=0,
        channel_prefix=prefix, announce_interval_s=0.5, stream_writers=STREAM_WRITERS,
    )  # fmt: skip
    try:
        await cluster.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            await _session(cluster.urls, session, recording)
            await asyncio.sleep(1.5)  # every writer's next POSITION
            health = await cluster.health("sync1")
            streams = {*health["replication"]["streams"], *health["persisted_upto"], "typing", "presence"}
    finally:
        await cluster.stop()
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    silent = sorted(streams - recording.with_rows())
    if silent:
        raise RuntimeError(f"streams {silent} sent no row: extend the session in {__name__}")
    async with connect(database_url) as conn:
        rows = await conn.fetch("SELECT instance_id, instance_name FROM instance_map ORDER BY 1")
    _write(out, recording, {str(r["instance_id"]): r["instance_name"] for r in rows})
    return recording


def _write(out: Path, recording: Recording, instance_map: dict[str, str]) -> None:
    wire = out / "wire"
    shutil.rmtree(wire, ignore_errors=True)
    (wire / "streams").mkdir(parents=True)
    for stream, lines in sorted(recording.streams.items()):
        (wire / "streams" / f"{stream}.lines").write_text("".join(f"{line}\n" for line in lines))
    (wire / "cluster.lines").write_text("".join(f"{line}\n" for line in recording.cluster))
    mixed = {s: sorted(c) for s, c in recording.channels.items() if len(c) != 1}
    if mixed:
        raise RuntimeError(f"streams heard on more than one channel: {mixed}")
    channels = {s: next(iter(c)) for s, c in sorted(recording.channels.items())}
    (wire / "channels.json").write_text(json.dumps(channels, indent=1) + "\n")
    tokens = {
        "release": importlib.metadata.version("fanout"),
        "sync_streams": list(SYNC_STREAMS),
        "instance_map": instance_map,
        "tokens": recording.tokens,
    }
    (out / "tokens.json").write_text(json.dumps(tokens, indent=1) + "\n")


@contextlib.asynccontextmanager
async def _scratch_database(admin_url: str) -> AsyncIterator[str]:
    """A fresh database beside `admin_url`'s, dropped afterwards."""
    base, _, _ = admin_url.rpartition("/")
    name = f"compat_{uuid.uuid4().hex[:8]}"
    async with connect(admin_url) as conn:
        await conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{base}/{name}"
    finally:
        async with connect(admin_url) as conn:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.harness.compat", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("tests/compat"))
    parser.add_argument(
        "--database-url", help="an admin URL: a scratch database is created beside it, dropped afterwards"
    )
    parser.add_argument("--redis-url")
    args = parser.parse_args(argv)
    with given_or_embedded(args.database_url, args.redis_url) as (admin_url, redis_url):

        async def run() -> Recording:
            with tempfile.TemporaryDirectory(prefix="fanout-compat-") as workdir:
                async with _scratch_database(admin_url) as database_url:
                    return await record(database_url, redis_url, args.out, Path(workdir))

        recording = asyncio.run(run())
    counts = ", ".join(f"{s} {len(lines)}" for s, lines in sorted(recording.streams.items()))
    print(f"recorded {counts}; {len(recording.tokens)} tokens -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
