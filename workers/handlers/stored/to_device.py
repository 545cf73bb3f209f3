"""To-device messages: `sendToDevice` from any worker, delivery in the recipient device's /sync.

A send runs on the sender's to_device writer: it claims the (sender, device, txn id) so a retry
writes nothing twice, expands `*` to every device the recipient has, and inserts one
`device_inbox` row per local device and one outbox row per remote server, all at one stream id,
in one transaction. Its stream rows are the recipients (users and servers), one row each.

Delivery (`ToDeviceInbox.deliver`, on the syncing worker): a device's messages after its `since`
up to the sync's token, oldest first, at most `MAX_PER_SYNC`; when more wait, the token's
to_device position stops just before the first one left, so the next sync continues there.
A sync whose `since` covers messages acknowledges them: they are deleted then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from idgen import MultiWriterStreamToken
from workers.handlers.placement.stream_writes import UserStreamWrites, object_arg, text_arg, written
from workers.storage import to_device as store
from workers.storage.windows import Window
from workers.streams.to_device import ToDeviceRow

MAX_PER_SYNC = 100
ALL_DEVICES = "*"


@dataclass(frozen=True, slots=True)
class Delivery:
    """A device's messages for one sync and the to_device token they reach."""

    events: list[dict[str, Any]]
    token: MultiWriterStreamToken


class ToDeviceInbox:
    def __init__(self, writes: UserStreamWrites, pool: asyncpg.Pool, server_name: str) -> None:
        self.writes = writes
        self._pool = pool
        self.server_name = server_name
        self.delivered = 0
        writes.ops["send"] = self._send

    async def send(
        self, sender: str, device_id: str, txn_id: str, event_type: str, messages: dict[str, Any]
    ) -> None:
        """Send `messages` ({user: {device or "*": content}}) of `event_type`; idempotent per txn."""
        await self.writes.run(
            sender,
            "send",
            {"user_id": sender, "device_id": device_id, "txn_id": txn_id, "type": event_type,
             "messages": messages},
        )  # fmt: skip

    async def deliver(
        self,
        user_id: str,
        device_id: str,
        since: MultiWriterStreamToken | None,
        now: MultiWriterStreamToken,
        limit: int = MAX_PER_SYNC,
    ) -> Delivery:
        """The device's messages in (since, now], after deleting those `since` acknowledges."""
        async with self._pool.acquire() as conn:
            if since is not None:
                await store.delete_delivered(conn, user_id, device_id, Window.between(None, since))
            found = await store.messages_for_device(
                conn, user_id, device_id, Window.between(since, now), limit + 1
            )
        if len(found) > limit:
            cut = found[limit - 1][0]
            now = now.bound_stream_token(cut).copy_and_advance(since or MultiWriterStreamToken(0))
            found = found[:limit]
        self.delivered += len(found)
        return Delivery([message for _, message in found], now)

    # -- on the writer ---------------------------------------------------------------------------

    async def _send(self, args: dict[str, Any]) -> dict[str, Any]:
        sender, device_id = text_arg(args, "user_id"), text_arg(args, "device_id")
        txn_id, event_type = text_arg(args, "txn_id"), text_arg(args, "type")
        messages = object_arg(args, "messages")
        local_users = [u for u in messages if _server_of(u) == self.server_name]
        remote: dict[str, dict[str, Any]] = {}
        for user_id, per_device in messages.items():
            if not isinstance(per_device, dict) or not all(isinstance(c, dict) for c in per_device.values()):
                raise ValueError(f"messages[{user_id!r}] must map device ids to objects")
            if user_id not in local_users:
                remote.setdefault(_server_of(user_id), {})[user_id] = per_device
        me = self.writes.name

        async def body(conn: Any, ids: list[int]) -> list[tuple[int, Any]]:
            stream_id = ids[0]
            if not await store.claim_txn(conn, sender, device_id, txn_id, stream_id):
                return []
            devices = await store.devices_of(conn, local_users)
            inbox: list[tuple[str, str, dict[str, Any]]] = []
            for user_id in local_users:
                per_device = messages[user_id]
                for target, content in per_device.items():
                    expanded = devices.get(user_id, []) if target == ALL_DEVICES else [target]
                    for device in expanded:
                        if target == ALL_DEVICES and device in per_device:
                            continue  # named on its own too: that message wins
                        inbox.append(
                            (user_id, device, {"type": event_type, "sender": sender, "content": content})
                        )
            if inbox:
                await store.add_local(conn, inbox, stream_id, me)
            outbox = {
                server: {"sender": sender, "type": event_type, "message_id": txn_id, "messages": users}
                for server, users in remote.items()
            }
            if outbox:
                await store.add_remote(conn, outbox, stream_id, me)
            recipients = sorted({u for u, _, _ in inbox}) + sorted(outbox)
            return [(stream_id, ToDeviceRow(entity)) for entity in recipients]

        return written(await self.writes.here().write(1, body, local_users, sender))


def _server_of(user_id: str) -> str:
    return user_id.partition(":")[2]
