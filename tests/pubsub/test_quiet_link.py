"""The quiet link on a real server: nothing comes back, order holds across a reconnect, and a
server that refuses CLIENT REPLY is told of once."""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio as aioredis

from pubsub.quiet_link import QuietLink
from pubsub.redis_transport import pack_publishes


async def _received(sub: aioredis.client.PubSub, count: int) -> list[str]:
    got: list[str] = []
    async with asyncio.timeout(10):
        while len(got) < count:
            message = await sub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None:
                got.append(message["data"].decode())
    return got


async def _received_subscribed(sub: aioredis.client.PubSub) -> None:
    async with asyncio.timeout(10):
        while (await sub.get_message(timeout=1.0)) is None:
            pass


async def test_sends_keep_their_order_across_a_killed_link(redis_url: str, channel_prefix: str) -> None:
    """Publishes sent while the link must reconnect (the server killed it) queue behind the
    reconnect, later ones behind them, and all reach a subscriber in the order they were sent;
    nothing is ever read back."""
    channel = f"{channel_prefix}/quiet"
    admin = aioredis.Redis.from_url(redis_url)
    sub = admin.pubsub()
    await sub.subscribe(channel)
    await _received_subscribed(sub)
    link = QuietLink(redis_url)
    try:
        assert await link.send(pack_publishes(b"PUBLISH", [(channel, "first")])[0])
        assert await _received(sub, 1) == ["first"]
        name = link.socket_name()
        assert name is not None and link.unread() == 0
        assert await admin.client_kill_filter(addr=f"{name[0]}:{name[1]}") == 1
        await asyncio.sleep(0.1)  # the link reads the server's EOF
        lines = [str(n) for n in range(200)]

        def send(line: str) -> asyncio.Future[bool]:
            return asyncio.ensure_future(link.send(pack_publishes(b"PUBLISH", [(channel, line)])[0]))

        sends = [send(line) for line in lines[:100]]  # the first reconnects, the rest queue
        assert await sends[0]  # it reconnected and wrote: the queued ones wake one a turn
        sends += [send(line) for line in lines[100:]]  # while the queued ones are still waking
        assert all(await asyncio.gather(*sends))
        assert await _received(sub, 200) == lines
        assert link.connects == 2 and link.unread() == 0
    finally:
        await link.close()
        await sub.aclose()
        await admin.aclose()


async def test_a_server_that_refuses_client_reply_is_asked_once(redis_url: str) -> None:
    """A user whose ACL leaves CLIENT REPLY out: the first send is told no and the link is done
    (no socket kept); later sends say so at once, for the caller to read replies itself."""
    user, password = f"fanout-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = aioredis.Redis.from_url(redis_url)
    await admin.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all", "-client|reply"
    )
    host_port = redis_url.split("://", 1)[1]
    link = QuietLink(f"redis://{user}:{password}@{host_port}")
    try:
        payload = pack_publishes(b"PUBLISH", [("fanout-quiet-refused", "x")])[0]
        assert not await link.send(payload)
        assert link.refused and link.connects == 0
        assert not await link.send(payload)
    finally:
        await link.close()
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()
