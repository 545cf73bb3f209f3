"""Aliases and Protocols shared by the `pubsub` modules (no behaviour here; imports no other module
of the package, so any of them can import it). Types that name a `Stream` live in `streams.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import redis.asyncio as aioredis


class IdGenerator(Protocol):
    """What `pubsub` needs from an ID generator (`idgen.MultiWriterIdGenerator` satisfies it).

    Values are signed database IDs: negative for a negative (backfill) stream.
    """

    def get_current_token_for_writer(self, instance_name: str) -> int: ...

    def advance(self, instance_name: str, new_id: int) -> None: ...

    def get_positions(self) -> dict[str, int]: ...


#: A row of a stream: an instance of the stream's NamedTuple row type (see pubsub.streams).
Row = tuple[Any, ...]
#: (stream name, instance, token): runs after the generator was advanced.
PositionListener = Callable[[str, str, int], Awaitable[None] | None]
#: (instance, from_token exclusive, to_token inclusive, limit) -> [(token, row)] sorted by token.
UpdateFunction = Callable[[str, int, int, int], Awaitable[Sequence[tuple[int, Any]]]]
#: (instance, the rows of one apply, the last one's token last): None when it declines (nothing
#: read), else an awaitable of whether the database holds that last row at its token, written by
#: that instance (see `Stream.witness`).
Witness = Callable[[str, Sequence[tuple[int, Any]]], Awaitable[bool] | None]
#: (message number since start, counting from 0) -> True to drop that publish (fault-injection hook).
DropFilter = Callable[[int], bool]


class Transport(Protocol):
    """What the client and the publisher need of a Redis transport: `redis_transport.RedisTransport`
    (one server) or `redis_cluster_transport.RedisClusterTransport` (a Redis Cluster).

    `start(channels)` subscribes in the background; `subscribed` is set once every channel is
    confirmed and cleared when a subscription is lost; `connects` counts the times it was set.
    `publish_many` sends (channel, line) pairs, each channel's lines in order, and raises the
    link's error when any could not be sent. `hint_client()` is a client for reading the hint
    keys; `write_keys(commands)` writes them (HSET, SET, ...), in order."""

    subscribed: asyncio.Event
    connects: int

    def start(self, channels: Sequence[str]) -> None: ...

    async def stop(self) -> None: ...

    async def publish_many(self, messages: Sequence[tuple[str, str]]) -> int: ...

    async def publish(self, channel: str, line: str) -> int: ...

    async def hint_client(self) -> aioredis.Redis: ...

    async def write_keys(self, commands: Sequence[Sequence[str]]) -> None: ...
