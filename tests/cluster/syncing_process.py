"""A process with users syncing, for the presence-expiry test:
`python -m tests.cluster.syncing_process REDIS_URL PREFIX INSTANCE USER...`.

It is the presence half of a sync worker, with the same classes: a `ReplicationClient` to send on
and a `PresenceSyncTracker` that holds one /sync open per user and re-sends its starts as its
keep-alive. Prints its instance id once the starts are out, then runs until killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from pubsub.client import ReplicationClient, ReplicationSettings
from workers.handlers.ephemeral.presence_sync import PresenceSyncTracker, new_instance_id


async def run(redis_url: str, prefix: str, instance: str, users: list[str]) -> None:
    client = ReplicationClient(ReplicationSettings(instance, redis_url, channel_prefix=prefix), [])
    await client.start()
    tracker = PresenceSyncTracker(new_instance_id(instance), client.send_user_sync)
    async with contextlib.AsyncExitStack() as syncs:
        for user in users:
            await syncs.enter_async_context(tracker.sync_request(user, "DEVICE"))
        print(tracker.instance_id, flush=True)
        while True:
            await asyncio.sleep(0.3)
            await tracker.resend_starts()


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
