"""Every Redis channel and key name `pubsub` uses, in one place. Every name starts with the prefix.

Channels: everything on `<prefix>`; with per-stream channels, RDATA and POSITION of stream `s`
go to `<prefix>/<s>` while REPLICATE and USER_SYNC stay on `<prefix>`. Channel names carry no hash
tag: on a Redis Cluster with sharded pub/sub each stream's channel hashes to its own slot, so the
streams spread over the shards.
Keys (hints for people and tools, never the source of truth), all in the slot of `HINTS_TAG` so
that one pipeline to one node writes them and `fanout inspect` finds them on one node:
`<prefix>:{hints}:positions:<stream>` hash, field = instance, value = latest announced wire token;
`<prefix>:{hints}:heartbeat:<instance>` JSON `{"ts": unix_seconds, "streams": [...]}` with a TTL.
"""

from __future__ import annotations

#: The hash tag of every key: on a Redis Cluster they share its slot.
HINTS_TAG = "{hints}"


def base_channel(prefix: str) -> str:
    return prefix


def stream_channel(prefix: str, stream: str, per_stream: bool) -> str:
    return f"{prefix}/{stream}" if per_stream else prefix


def positions_key(prefix: str, stream: str) -> str:
    return f"{prefix}:{HINTS_TAG}:positions:{stream}"


def heartbeat_key(prefix: str, instance: str) -> str:
    return f"{prefix}:{HINTS_TAG}:heartbeat:{instance}"


def positions_pattern(prefix: str) -> str:
    return f"{prefix}:{HINTS_TAG}:positions:*"


def heartbeat_pattern(prefix: str) -> str:
    return f"{prefix}:{HINTS_TAG}:heartbeat:*"
