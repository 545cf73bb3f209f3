"""`fanout inspect`: read the replication traffic, or every stream's vector clock, as a person would.

    fanout inspect [--redis-url URL | --redis-cluster URL,URL | --config FILE] [--prefix P]
                   [--streams a,b] [--positions] [--count N]

Live mode subscribes to `<prefix>` (and `<prefix>/<stream>` for --streams) and prints each command
decoded, one per line (an RDATA row's fields by name, as its stream defines them); lines that
`pubsub` would reject are printed as `REJECTED <reason>`.
`--positions` prints the positions hashes and heartbeat keys writers keep for people: hints,
not the source of truth (that is the database). On a Redis Cluster (`--redis-cluster`, or a
config with `redis_cluster`) live mode follows each channel to its shard as a worker does (lines
are printed without their channel) and the positions come from whichever node holds them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from pubsub import keys
from pubsub.errors import WireError
from pubsub.metrics import ReplicationMetrics
from pubsub.redis_cluster_transport import RedisClusterTransport
from pubsub.wire import RData, command_name, parse_line
from workers.process import event_loop
from workers.streams.account_data import ACCOUNT_DATA, AccountDataRow
from workers.streams.caches import CACHES, CacheRow
from workers.streams.device_lists import DEVICE_LISTS, DeviceListRow
from workers.streams.events import BACKFILL, EVENTS, EventRow
from workers.streams.presence import PRESENCE, PresenceRow
from workers.streams.receipts import RECEIPTS, ReceiptRow
from workers.streams.to_device import TO_DEVICE, ToDeviceRow
from workers.streams.typing import TYPING, TypingRow


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fanout inspect", description=__doc__.split("\n")[0])
    p.add_argument("--redis-url", help="redis://, rediss:// or unix:// URL")
    p.add_argument("--redis-cluster", default="", help="a Redis Cluster's node URLs, comma-separated")
    p.add_argument("--prefix", help="channel prefix (default: from --config, else 'fanout')")
    p.add_argument("--config", help="a worker's YAML configuration instead of --redis-url/--prefix")
    p.add_argument("--positions", action="store_true", help="print every stream's vector clock and exit")
    p.add_argument(
        "--streams", default="", help="also subscribe to these per-stream channels (comma-separated)"
    )
    p.add_argument("--sharded", action="store_true", help="use SSUBSCRIBE (sharded pub/sub)")
    p.add_argument("--count", type=int, default=0, help="exit after N messages (0: run until Ctrl-C)")
    return p


#: The row fields of every stream the workers replicate, by stream name.
ROW_FIELDS: dict[str, tuple[str, ...]] = {
    EVENTS: EventRow._fields, BACKFILL: EventRow._fields, CACHES: CacheRow._fields,
    TYPING: TypingRow._fields, PRESENCE: PresenceRow._fields, ACCOUNT_DATA: AccountDataRow._fields,
    DEVICE_LISTS: DeviceListRow._fields, TO_DEVICE: ToDeviceRow._fields, RECEIPTS: ReceiptRow._fields,
}  # fmt: skip


def _named_fields(cmd: RData) -> str:
    """The row's fields by name (`entity=@bob:hs`), or the raw JSON when it does not fit its stream."""
    fields = ROW_FIELDS.get(cmd.stream)
    try:
        values = json.loads(cmd.row_json)
    except ValueError:
        return cmd.row_json
    if fields is None or not isinstance(values, list):
        return cmd.row_json
    prefix = ""
    if cmd.token is not None and len(values) >= 2:  # a numbered row starts with prev and its count
        prefix, values = f"prev={values[0]} rows={values[1]} ", values[2:]
    if not values or len(values) > len(fields):  # trailing optional fields may be left out
        return cmd.row_json
    named = zip(fields, values, strict=False)
    return prefix + " ".join(f"{name}={json.dumps(value)}" for name, value in named)


def describe(data: bytes, max_bytes: int = 1 << 20) -> str:
    """One printable line for one received message: its command, and for RDATA the stream, writer,
    token and the row's fields by name."""
    try:
        cmd = parse_line(data, max_bytes)
    except WireError as e:
        return f"REJECTED {e.reason}: {e.detail} | {data[:120]!r}"
    if isinstance(cmd, RData):
        token = "batch" if cmd.token is None else cmd.token
        return f"RDATA stream={cmd.stream} instance={cmd.instance} token={token} {_named_fields(cmd)}"
    fields = " ".join(f"{name}={value}" for name, value in cmd._asdict().items())
    return f"{command_name(cmd)} {fields}".rstrip()


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


async def positions_table(client: aioredis.Redis | RedisCluster, prefix: str) -> str:
    """The positions hashes (stream x writer) and the heartbeats, as an aligned text table."""
    clocks: dict[str, dict[str, str]] = {}
    async for key in client.scan_iter(match=keys.positions_pattern(prefix), count=200):
        name = key.decode() if isinstance(key, bytes) else key
        raw = await client.hgetall(name)
        clocks[name.rsplit(":", 1)[1]] = {_text(k): _text(v) for k, v in raw.items()}
    beats: dict[str, tuple[str, int]] = {}
    async for key in client.scan_iter(match=keys.heartbeat_pattern(prefix), count=200):
        name = key.decode() if isinstance(key, bytes) else key
        value, ttl = await client.get(name), await client.pttl(name)
        try:
            age = f"{time.time() - float(json.loads(value or '{}')['ts']):.1f}s ago"
        except (TypeError, ValueError, KeyError):
            age = "?"
        beats[name.rsplit(":", 1)[1]] = (age, ttl)
    lines = [f"streams (from {keys.positions_pattern(prefix)}):"]
    if not clocks:
        lines.append("  (none: no writer has announced yet)")
    for stream in sorted(clocks):
        clock = ", ".join(f"{w}={t}" for w, t in sorted(clocks[stream].items()))
        lines.append(f"  {stream:<24} {{{clock}}}")
    lines.append(f"heartbeats (from {keys.heartbeat_pattern(prefix)}):")
    if not beats:
        lines.append("  (none alive)")
    for instance in sorted(beats):
        age, ttl = beats[instance]
        lines.append(f"  {instance:<24} last beat {age}, expires in {ttl / 1000:.1f}s")
    return "\n".join(lines)


async def _live(client: aioredis.Redis, channels: list[str], sharded: bool, count: int) -> None:
    pubsub = client.pubsub()
    if sharded:
        await pubsub.ssubscribe(*channels)
    else:
        await pubsub.subscribe(*channels)
    print(f"listening on {', '.join(channels)} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    seen = 0
    try:
        while count == 0 or seen < count:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is None:
                continue
            channel = message["channel"].decode(errors="replace")
            print(f"{time.strftime('%H:%M:%S')} [{channel}] {describe(message['data'])}", flush=True)
            seen += 1
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def _live_on_cluster(urls: list[str], channels: list[str], sharded: bool, count: int) -> None:
    """Live mode through the cluster transport: each channel read on the shard that owns it."""
    seen = 0
    done = asyncio.Event()
    subscribed = asyncio.Event()

    def show(lines: list[bytes], now: float) -> None:
        nonlocal seen
        for data in lines:
            print(f"{time.strftime('%H:%M:%S')} {describe(data)}", flush=True)
            seen += 1
            if count and seen >= count:
                done.set()

    def lost() -> None:
        if subscribed.is_set():
            print(f"{time.strftime('%H:%M:%S')} (a shard link was lost: lines may be missing)", flush=True)

    transport = RedisClusterTransport(
        urls, metrics=ReplicationMetrics(), on_lines=show, on_subscribed=subscribed.set,
        on_connection_lost=lost, sharded=sharded, home="fanout-inspect",
    )  # fmt: skip
    transport.start(channels)
    print(f"listening on {', '.join(channels)} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        await done.wait()
    finally:
        await transport.stop()


async def _run(args: argparse.Namespace) -> int:
    url, prefix, sharded = args.redis_url, args.prefix, args.sharded
    cluster = [u for u in args.redis_cluster.split(",") if u]
    if args.config:
        from workers.config import ConfigError, load_config

        try:
            config = load_config(args.config)
        except ConfigError as e:
            print(f"fanout inspect: {e}", file=sys.stderr)
            return 2
        url = url or config.redis_url
        cluster = cluster or ([] if args.redis_url else list(config.redis_cluster))
        prefix = prefix or config.channel_prefix
        sharded = sharded or config.sharded_pubsub
    if not url and not cluster:
        print("fanout inspect: give --redis-url, --redis-cluster or --config", file=sys.stderr)
        return 2
    prefix = prefix or "fanout"
    streams = [s for s in args.streams.split(",") if s]
    channels = [keys.base_channel(prefix)] + [keys.stream_channel(prefix, s, True) for s in streams]
    if cluster and not args.positions:
        await _live_on_cluster(cluster, channels, sharded, args.count)
        return 0
    client: aioredis.Redis | RedisCluster = (
        RedisCluster.from_url(cluster[0]) if cluster else aioredis.Redis.from_url(url, protocol=2)
    )
    try:
        if args.positions:
            print(await positions_table(client, prefix))
            return 0
        assert isinstance(client, aioredis.Redis)
        await _live(client, channels, sharded, args.count)
        return 0
    finally:
        await client.aclose()


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return event_loop.run(_run(args))
    except KeyboardInterrupt:
        return 0
    except (OSError, RedisError, RedisClusterException) as e:
        print(f"fanout inspect: cannot reach Redis: {e}", file=sys.stderr)
        return 1
