"""Faults of a Redis Cluster, done for real: a slot migrated to another shard, a primary killed.

For the tests and `make scale`. Each works from node URLs alone (the cluster's own view, never a
list kept on the side), so it holds after earlier migrations and failovers.

* `owner_of(urls, name)`: the primary serving `name`'s slot (a channel or a key), as the cluster says.
* `migrate_slot(urls, name)`: move that slot, with its keys, to another primary, the way
  `redis-cli --cluster reshard` does (IMPORTING, MIGRATING, MIGRATE, SETSLOT NODE). Subscribers of
  a sharded channel in it get `sunsubscribe` from the old owner.
* `wait_for_new_owner(urls, name, old)`: after the owner was killed, until a replica took over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.crc import key_slot

from workers.errors import WorkerError

Address = tuple[str, int]


class ClusterFaultError(WorkerError):
    """The cluster did not do what the fault needed (no other primary, no failover in time)."""


def _address(url: str) -> Address:
    host_port = url.split("://", 1)[1].split("/", 1)[0].rpartition("@")[2]
    host, _, port = host_port.rpartition(":")
    return host, int(port)


async def _command(address: Address, *args: Any) -> Any:
    client = aioredis.Redis(host=address[0], port=address[1], socket_timeout=5, socket_connect_timeout=2)
    try:
        return await client.execute_command(*args)  # type: ignore[no-untyped-call]
    finally:
        await client.aclose()


async def slot_map(urls: Sequence[str]) -> list[tuple[int, int, Address, str]]:
    """(first slot, last slot, primary address, primary id) from the first node that answers."""
    errors = []
    for url in urls:
        try:
            ranges = await _command(_address(url), "CLUSTER", "SLOTS")
        except (OSError, aioredis.RedisError) as e:
            errors.append(f"{url}: {e}")
            continue
        return [(int(r[0]), int(r[1]), (r[2][0].decode(), int(r[2][1])), r[2][2].decode()) for r in ranges]
    raise ClusterFaultError(f"no node answered CLUSTER SLOTS: {errors}")


async def owner_of(urls: Sequence[str], name: str) -> tuple[Address, str]:
    """The address and node id of the primary serving `name`'s slot."""
    slot = key_slot(name.encode())
    for low, high, address, node_id in await slot_map(urls):
        if low <= slot <= high:
            return address, node_id
    raise ClusterFaultError(f"slot {slot} of {name!r} is served by no node")


async def migrate_slot(urls: Sequence[str], name: str) -> tuple[Address, Address]:
    """Move `name`'s slot (and its keys) to another primary; returns (old owner, new owner)."""
    slot = key_slot(name.encode())
    source, source_id = await owner_of(urls, name)
    others = {(address, node_id) for _, _, address, node_id in await slot_map(urls) if address != source}
    if not others:
        raise ClusterFaultError("a slot can only move when there is another primary")
    target, target_id = min(others)
    await _command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    await _command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    while keys := await _command(source, "CLUSTER", "GETKEYSINSLOT", slot, 100):
        await _command(source, "MIGRATE", target[0], target[1], "", 0, 5000, "KEYS", *keys)
    for node in (target, source):
        await _command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    return source, target


async def wait_for_new_owner(
    urls: Sequence[str], name: str, old: Address, timeout_s: float = 30.0
) -> Address:
    """Poll the surviving nodes until `name`'s slot is served by a primary other than `old`."""
    alive = [url for url in urls if _address(url) != old]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            address, _ = await owner_of(alive, name)
            if address != old:
                return address
        except ClusterFaultError:
            pass
        if time.monotonic() > deadline:
            raise ClusterFaultError(f"no replica took over {name!r}'s slot within {timeout_s:.0f}s")
        await asyncio.sleep(0.1)
