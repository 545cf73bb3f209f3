"""Every Redis channel and key name `pubsub` uses, in one place.

Channels: everything on `<prefix>`; with per-stream channels, RDATA and POSITION of stream `s`
go to `<prefix>/<s>` while REPLICATE and USER_SYNC stay on `<prefix>`.
Keys (hints for people and tools, never the source of truth):
`<prefix>:positions:<stream>` hash, field = instance, value = latest announced wire token;
`<prefix>:heartbeat:<instance>` JSON `{"ts": unix_seconds, "streams": [...]}` with a TTL.
"""

from __future__ import annotations


def base_channel(prefix: str) -> str:
    return prefix


def stream_channel(prefix: str, stream: str, per_stream: bool) -> str:
    return f"{prefix}/{stream}" if per_stream else prefix


def positions_key(prefix: str, stream: str) -> str:
    return f"{prefix}:positions:{stream}"


def heartbeat_key(prefix: str, instance: str) -> str:
    return f"{prefix}:heartbeat:{instance}"


def positions_pattern(prefix: str) -> str:
    return f"{prefix}:positions:*"


def heartbeat_pattern(prefix: str) -> str:
    return f"{prefix}:heartbeat:*"
