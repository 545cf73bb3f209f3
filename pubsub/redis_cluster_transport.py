"""Redis Cluster transport: each channel on the shard that owns it, one `RedisTransport` per primary.

The same interface and guarantees as `RedisTransport` (`pubsub.types.Transport`), built from one
`RedisTransport` per primary node (its channels, its publishes: the same receive and publish
paths as on one server), plus what a cluster adds:

* Routing. With `sharded`, a channel belongs to the primary owning its slot (CRC16 of its name:
  each stream's channel lands on a shard of its own): SPUBLISH goes there, SSUBSCRIBE is sent
  there. Without it (PUBLISH, which the cluster copies to every node), all of this process's
  channels use one primary, the owner of `home`'s slot, so processes spread over the nodes. The
  slot map is redis-py's cluster client's.
* A subscription can end while its connection lives: a slot migration or a failover makes the old
  owner send `sunsubscribe` (its link then fails on purpose), a stale map gets MOVED, a killed
  primary refuses connections. Each reaches `on_connection_lost` (every stream waits for a
  POSITION) and makes the map be read again; links are rebuilt where channels moved (which again
  reports the connection lost), and once every link has confirmed its channels `on_subscribed`
  runs (REPLICATE), as after any reconnect. While a link is down the map is re-read every
  `REMAP_INTERVAL_S`: a failover takes the cluster's node timeout plus an election.
* A publish refused with MOVED, or lost with its node, raises like any failed publish (the
  publisher counts it; readers catch up at the next POSITION) and makes the map be read again.
  Publishes to different shards go out concurrently; one channel's lines stay in order.
* `hint_client()` (the hint keys) is the client of the primary owning `keys.HINTS_TAG`'s slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from pubsub import keys
from pubsub.metrics import ReplicationMetrics
from pubsub.redis_transport import LINK_ERRORS, DropCounter, RedisTransport, backoff_delay
from pubsub.tasks import cancel_and_wait
from pubsub.types import DropFilter

log = logging.getLogger(__name__)
#: How often the slot map is read again while some link is not subscribed.
REMAP_INTERVAL_S = 0.5
#: What reading the map or routing a channel raises when the cluster cannot answer.
MAP_ERRORS: tuple[type[Exception], ...] = (*LINK_ERRORS, RedisClusterException)


def node_url(seed_url: str, host: str, port: int) -> str:
    """`seed_url` (scheme, credentials, TLS options) pointed at another node."""
    parts = urlsplit(seed_url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit((parts.scheme, f"{userinfo}@{address}" if userinfo else address, "/0", parts.query, ""))


class RedisClusterTransport:
    """Connections to a Redis Cluster; see the module docstring for the guarantees."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        metrics: ReplicationMetrics,
        on_lines: Callable[[list[bytes], float], None],
        on_subscribed: Callable[[], None],
        on_connection_lost: Callable[[], None],
        sharded: bool,
        home: str,
        drop_filter: DropFilter | None = None,
        watchdog_s: float = 10.0,
    ) -> None:
        if not urls:
            raise ValueError("a Redis Cluster transport needs at least one node URL")
        self.url = urls[0]
        self.sharded = sharded
        self.metrics = metrics
        self.watchdog_s = watchdog_s
        self._on_lines = on_lines
        self._on_subscribed = on_subscribed
        self._on_connection_lost = on_connection_lost
        self._home = home
        self._drops = None if drop_filter is None else DropCounter(drop_filter, metrics)
        startup = [ClusterNode(p.hostname or "127.0.0.1", p.port or 6379) for p in map(urlsplit, urls[1:])]
        self._cluster = RedisCluster.from_url(
            urls[0], startup_nodes=startup, protocol=2, socket_timeout=5, socket_connect_timeout=5
        )
        self._mapped = False
        #: node name ("host:port") -> its link, and the channels that link subscribes to.
        self._links: dict[str, RedisTransport] = {}
        self._subscriptions: dict[str, tuple[bytes, ...]] = {}
        self._routes: dict[str, RedisTransport] = {}
        self._channels: list[str] = []
        self._remap = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()
        self.connects = 0

    # -- publishing ----------------------------------------------------------------------------

    async def publish_many(self, messages: Sequence[tuple[str, str]]) -> int:
        """Publish (channel, line) pairs, each channel's in order; returns how many were sent.

        Raises the first link error once every shard's batch was tried."""
        if self._drops is not None:
            messages = self._drops.kept(messages)
        if not messages:
            return 0
        if not self._mapped:
            await self._read_map()
        batches: dict[RedisTransport, list[tuple[str, str]]] = {}
        routes = self._routes
        for message in messages:
            link = routes.get(message[0]) or self._route(message[0])
            batch = batches.get(link)
            if batch is None:
                batches[link] = [message]
            else:
                batch.append(message)
        if len(batches) == 1:
            [(link, batch)] = batches.items()
            return await self._publish_on(link, batch)
        results = await asyncio.gather(
            *(self._publish_on(link, batch) for link, batch in batches.items()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return sum(r for r in results if isinstance(r, int))

    async def publish(self, channel: str, line: str) -> int:
        return await self.publish_many([(channel, line)])

    async def _publish_on(self, link: RedisTransport, batch: list[tuple[str, str]]) -> int:
        try:
            return await link.publish_many(batch)
        except LINK_ERRORS:
            self._remap.set()  # MOVED, or the node is gone: its channels may have moved
            raise

    def _owner(self, name: str, *, key: bool = False) -> str:
        """The name ("host:port") of the primary for `name`: the owner of its slot when it is a
        `key` or a sharded channel, else the owner of `home`'s slot."""
        try:
            node = self._cluster.get_node_from_key(name if self.sharded or key else self._home)
        except RedisClusterException as e:  # a slot no node serves (yet)
            self._remap.set()
            raise RedisConnectionError(f"redis cluster: {e}") from e
        assert node is not None
        return str(node.name)

    def _route(self, name: str, *, key: bool = False) -> RedisTransport:
        """The link of the primary for `name` (see `_owner`), made (to publish only) when missing."""
        owner = self._owner(name, key=key)
        link = self._links.get(owner)
        if link is None:
            link = self._links[owner] = self._link(owner)
        self._routes[name] = link
        return link

    async def _hint_link(self) -> RedisTransport:
        """The link of the node that holds the hint keys (all in `keys.HINTS_TAG`'s slot). A
        MOVED there is the caller's failed write: the map is read again on the next lost link."""
        if not self._mapped:
            await self._read_map()
        return self._route(keys.HINTS_TAG, key=True)

    async def hint_client(self) -> aioredis.Redis:
        return (await self._hint_link()).publisher

    async def write_keys(self, commands: Sequence[Sequence[str]]) -> None:
        """Hint-key writes on the hint keys' node, replies read (a cluster's links ask for them:
        a MOVED is one), the first error raised."""
        await (await self._hint_link()).write_keys(commands)

    # -- subscribing ---------------------------------------------------------------------------

    def start(self, channels: Sequence[str]) -> None:
        self._channels = list(channels)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="repl-cluster-map")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        links = list(self._links.values())
        self._links.clear()
        self._routes.clear()
        for link in links:
            await link.stop()
        await self._cluster.aclose()

    def _link(self, owner: str) -> RedisTransport:
        """A link to `owner`. Until it is stopped, a retired link (one that `_links` no longer
        holds) may still read or fail: what it reports is ignored, or a stale loss would undo the
        subscription of the link that replaced it."""
        host, _, port = owner.rpartition(":")
        links = self._links

        def lines(batch: list[bytes], now: float) -> None:
            if links.get(owner) is link:
                self._on_lines(batch, now)

        def subscribed() -> None:
            if links.get(owner) is link:
                self._link_subscribed()

        def lost() -> None:
            if links.get(owner) is link:
                self._link_lost()

        link = RedisTransport(
            node_url(self.url, host.strip("[]"), int(port)),
            metrics=self.metrics,
            on_lines=lines,
            on_subscribed=subscribed,
            on_connection_lost=lost,
            sharded=self.sharded,
            watchdog_s=self.watchdog_s,
        )
        return link

    def _link_subscribed(self) -> None:
        links = self._links
        if self.subscribed.is_set() or not all(
            name in links and links[name].subscribed.is_set() for name in self._subscriptions
        ):
            return
        self.connects += 1
        self.subscribed.set()
        self._on_subscribed()

    def _link_lost(self) -> None:
        self.subscribed.clear()
        self._on_connection_lost()
        self._remap.set()

    async def _read_map(self) -> None:
        try:
            if self._mapped:
                await self._cluster.nodes_manager.initialize()
            else:
                await self._cluster.initialize()
        except RedisClusterException as e:
            raise RedisConnectionError(f"redis cluster: cannot read the slot map: {e}") from e
        self._mapped = True
        self._routes = {}

    async def _run(self) -> None:
        attempt = 0
        while True:
            self._remap.clear()
            try:
                await self._read_map()
                await self._resubscribe()
                self._link_subscribed()  # links that confirmed while the map was being read
                attempt = 0
            except MAP_ERRORS as e:
                delay = backoff_delay(attempt)
                attempt += 1
                log.warning("redis cluster: cannot route the channels (%s); retrying in %.2fs", e, delay)
                await asyncio.sleep(delay)
                continue
            timeout = None if self.subscribed.is_set() else REMAP_INTERVAL_S
            try:
                await asyncio.wait_for(self._remap.wait(), timeout)
            except TimeoutError:
                pass

    async def _resubscribe(self) -> None:
        """Give each primary the channels it owns now; rebuild only the links whose set changed,
        and drop the links of nodes that are no longer primaries."""
        owners: dict[str, list[bytes]] = {}
        for channel in self._channels:
            owners.setdefault(self._owner(channel), []).append(channel.encode())
        plan = {name: tuple(channels) for name, channels in owners.items()}
        primaries = {str(node.name) for node in self._cluster.get_primaries()}
        before = self._subscriptions
        changed = {name for name in before.keys() | plan.keys() if before.get(name) != plan.get(name)}
        gone = {name for name in self._links if name not in primaries and name not in plan}
        retired = [self._links.pop(name) for name in changed | gone if name in self._links]
        self._routes = {}
        if changed:
            log.info("redis cluster: subscribing %s", {n: [c.decode() for c in cs] for n, cs in plan.items()})
            self._subscriptions = plan
            # Channels moved: whatever was sent on them meanwhile is gone (the POSITIONs after
            # the new subscriptions' REPLICATE make every stream catch up).
            self.subscribed.clear()
            self._on_connection_lost()
            for name in changed & plan.keys():
                link = self._links[name] = self._link(name)
                link.start([c.decode() for c in plan[name]])
        for link in retired:
            await link.stop()
