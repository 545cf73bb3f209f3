"""CPU seconds of process groups, read from /proc: what the peer run charges to each side.

`Accounts` names groups of processes (a system's servers, PostgreSQL, Redis) and `sample()`
returns each group's CPU seconds so far (user + system of every thread). A group may be a process
tree (`tree=True`, for PostgreSQL: the postmaster forks a backend per connection): its own time,
the time of children it has reaped (cutime + cstime: backends that ended) and the time of its
live children; so a backend that ends between two samples is still counted. A process that is
gone counts 0 (its last time is lost: stop processes after the last sample).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def process_cpu(pid: int, *, reaped: bool = False) -> float:
    """CPU seconds of `pid` (with its reaped children's when `reaped`); 0 for a process gone."""
    fields = _stat(pid)
    if not fields:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return ticks / TICK


def children(pid: int) -> list[int]:
    """The live children of `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and int(fields[1]) == pid:
                found.append(int(entry))
    return found


def tree_cpu(pid: int) -> float:
    """CPU seconds of `pid`, the children it reaped and its live children."""
    return process_cpu(pid, reaped=True) + sum(process_cpu(c) for c in children(pid))


@dataclass
class Accounts:
    """Groups of processes by name: plain pids, or trees (a root whose children count)."""

    pids: dict[str, list[int]] = field(default_factory=dict)
    trees: dict[str, int] = field(default_factory=dict)

    def sample(self) -> dict[str, float]:
        """CPU seconds so far, by group."""
        found = {name: sum(process_cpu(p) for p in pids) for name, pids in self.pids.items()}
        found.update({name: tree_cpu(root) for name, root in self.trees.items()})
        return found


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds spent by each group between two samples."""
    return {name: round(after[name] - before.get(name, 0.0), 3) for name in after}
