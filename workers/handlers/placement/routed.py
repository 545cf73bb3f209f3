"""A write run on its key's writer, wherever that is now: a room's persister, or the writer of a
user's (a room's receipts') stored stream. Keys are leases that move between writers
(`workers.handlers.placement.leases`); `RoomPlacement` is this worker's guess of the holder.

A writer that does not hold the key names its holder (`NotOwner` here, the 409
`IO.FANOUT.NOT_OWNER` from another worker): the write goes there at once (at most `MAX_HOPS`
times). While the writer cannot take the write (it stops or restarts: unreachable, or it refused
the write unprocessed; the key is moving to another writer), the write is tried again, on whoever
holds the key then, for up to `within_s`; a write that may have reached the writer is tried again
only when `retry` (idempotent). So a writer's planned stop or restart delays its keys' writes
instead of failing them, and a crashed writer's keys are written elsewhere once its instance lease
expired.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from workers.errors import PersisterStopped
from workers.handlers.placement.forwarding import (
    NOT_OWNER_ERRCODE,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    ForwardRefused,
    OwnerUnavailable,
)
from workers.handlers.placement.leases import KeyLeaseLost, KeyMoving, NotOwner, holder_of
from workers.process.instance_lease import LeaseLost
from workers.routing import RoomPlacement

T = TypeVar("T")
#: Writers named as the holder that a write follows at once, before it waits.
MAX_HOPS = 3


@dataclass(slots=True)
class OwnerWaits:
    """Writes that had to wait for their key's writer, and the longest such wait."""

    count: int = 0
    longest_s: float = 0.0


async def routed(
    placement: RoomPlacement,
    key: str,
    name: str,
    here: Callable[[], Awaitable[T]],
    forward: Callable[[str], Awaitable[T]],
    *,
    retry: bool,
    within_s: float,
    waits: OwnerWaits,
) -> T:
    """The write on the key's writer: `here()` when that is this worker (`name`), else
    `forward(writer)`; followed and retried as the module says, a wait counted in `waits`. Raises
    what the attempt raises, or `OwnerUnavailable` once `within_s` is spent."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    pause = RETRY_FIRST_S
    hops = 0
    waited = False
    while True:
        owner = placement.owner(key)
        holder: str | None = None
        try:
            result = await (here() if owner == name else forward(owner))
        except NotOwner as e:
            holder, failure = e.holder, OwnerUnavailable(owner, str(e), unprocessed=True)
        except ForwardRefused as e:
            if e.body.get("errcode") != NOT_OWNER_ERRCODE:
                raise
            holder, failure = holder_of(e.body), OwnerUnavailable(owner, str(e), unprocessed=True)
        except OwnerUnavailable as e:
            if not (retry or e.unprocessed):
                raise
            placement.unavailable(owner)
            failure = e
        except (PersisterStopped, LeaseLost) as e:  # this worker stops: others take its keys
            placement.unavailable(name)
            failure = OwnerUnavailable(owner, str(e), unprocessed=True)
        except (KeyMoving, KeyLeaseLost) as e:
            failure = OwnerUnavailable(owner, str(e), unprocessed=True)
        else:
            placement.learned(key, owner)
            if waited:
                waits.count += 1
                waits.longest_s = max(waits.longest_s, loop.time() - started)
            return result
        if holder is not None and holder != owner and hops < MAX_HOPS:
            placement.learned(key, holder)
            hops += 1
            if placement.owner(key) == holder:
                continue  # the holder is not known to be away: ask it now
        if loop.time() - started + pause > within_s:
            raise failure
        waited = True
        await asyncio.sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)
