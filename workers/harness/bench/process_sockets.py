"""Which process holds a TCP connection: its local ports, read from /proc (Linux only).

A server names a client by its address (`addr=127.0.0.1:PORT` in Redis's CLIENT LIST,
`client_port` in PostgreSQL's pg_stat_activity); the port is a socket of one process here. A
process's sockets are the `socket:[inode]` links under /proc/PID/fd, and /proc/net/tcp(6) maps
each inode to its local port. A process that is gone, or whose fds may not be read, has none.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def _socket_inodes(pid: int) -> set[int]:
    found: set[int] = set()
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for entry in entries:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{entry}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def _port_by_inode() -> dict[int, int]:
    """inode -> local port of every TCP socket of this network namespace."""
    ports = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            ports[int(fields[9])] = int(fields[1].rpartition(":")[2], 16)
    return ports


def local_ports(pids: Iterable[int]) -> dict[int, int]:
    """local port -> the pid (of `pids`) whose socket it is."""
    by_inode = _port_by_inode()
    owners = {}
    for pid in pids:
        for inode in _socket_inodes(pid):
            port = by_inode.get(inode)
            if port is not None:
                owners[port] = pid
    return owners
