"""The systems the peer run drives, behind one shape: where each Matrix path goes, which processes
are its servers, how it starts and stops.

* `FanoutTarget`: a `LocalCluster` of 2 persisters and 1 sync worker. Registration, rooms and
  joins go to the sync worker; a send goes to the room's persister (`writer_for_room`, what a
  fanout-aware proxy does; any worker would take it and forward it); /sync to the sync worker.
  The persisters serve no reads (`serve_reads: false`, as compose/ deploys them and as Synapse's
  event persisters here serve no client): nothing is read from them, and a persister that
  serves reads applies every row the other one writes, which no one here would ask for. The
  cluster exempts its loopback clients from rate limits (`rc_exempt_addresses`).
* `SynapseTarget`: `SynapsePeer` (main + 2 event persisters + 1 sync worker). Everything but
  /sync goes to the main process, which creates events and hands them to the persisters; /sync
  goes to the sync worker. No reverse proxy: the driver picks the port, as a proxy would route.
* `BareTarget`: the bare aiohttp server of `bare_sync.py` (sends and long-polls, no storage): the
  ceiling, what the same driver reaches when the server costs next to nothing.

A target is started and stopped by the run, once per phase, so that only one system runs at a time.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import yaml

from workers.harness.bench.bare_server import BareServer, bare_server
from workers.harness.bench.peer.synapse_processes import SynapsePeer
from workers.harness.cluster import LocalCluster
from workers.routing import writer_for_room


class Target(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def server_pids(self) -> list[int]: ...

    def client_url(self) -> str:
        """Where registration, createRoom and join go."""
        ...

    def send_url(self, room_id: str) -> str: ...

    def sync_url(self) -> str: ...


class FanoutTarget:
    name = "fanout"

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    async def start(self) -> None:
        await self.cluster.start()

    async def stop(self) -> None:
        await self.cluster.stop()

    def server_pids(self) -> list[int]:
        return list(self.cluster.pids.values())

    def client_url(self) -> str:
        return self.cluster.url("sync1")

    def send_url(self, room_id: str) -> str:
        return self.cluster.url(writer_for_room(room_id, self.cluster.event_writers))

    def sync_url(self) -> str:
        return self.cluster.url("sync1")

    def shape(self) -> dict[str, dict[str, bool]]:
        """Each worker's roles, read back from the configuration it runs with (once started)."""
        roles = {}
        for name in self.cluster.workers:
            config = yaml.safe_load(self.cluster.config_path(name).read_text())
            writes = name in config.get("stream_writers", {}).get("events", [])
            roles[name] = {"writes_events": writes, "serve_reads": bool(config.get("serve_reads", True))}
        return roles


class SynapseTarget:
    name = "synapse"

    def __init__(self, peer: SynapsePeer) -> None:
        self.peer = peer

    async def start(self) -> None:
        await self.peer.start()

    async def stop(self) -> None:
        await self.peer.stop()

    def server_pids(self) -> list[int]:
        return list(self.peer.pids.values())

    def client_url(self) -> str:
        return self.peer.main_url

    def send_url(self, room_id: str) -> str:
        return self.peer.main_url

    def sync_url(self) -> str:
        return self.peer.sync_url


class BareTarget:
    name = "bare"

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._server: BareServer | None = None

    def _running(self) -> BareServer:
        if self._server is None:
            raise RuntimeError("the bare server is not started")
        return self._server

    async def start(self) -> None:
        self._server = self._stack.enter_context(bare_server("aiohttp"))

    async def stop(self) -> None:
        self._stack.close()
        self._server = None

    def server_pids(self) -> list[int]:
        return [self._running().pid]

    def client_url(self) -> str:
        return self._running().url

    def send_url(self, room_id: str) -> str:
        return self._running().url

    def sync_url(self) -> str:
        return self._running().url
