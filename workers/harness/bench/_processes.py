"""Benchmark processes behind pipes: spawned once (no inherited event loop), reused by every run.

The parent talks to each through one `Connection`; `recv` polls it without blocking the event loop.
`close` sends None (each process's loop ends on it), then joins, terminating what does not end.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


class ProcessPool:
    """`size` processes running `target(connection)`."""

    def __init__(self, target: Callable[[Connection], None], size: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns: list[Connection] = []
        self._procs: list[Any] = []
        for _ in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=target, args=(child,), daemon=True)
            proc.start()
            self.conns.append(parent)
            self._procs.append(proc)

    async def recv(self, conn: Connection, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while not conn.poll():
            if time.monotonic() > deadline:
                raise RuntimeError("a benchmark process did not answer in time")
            await asyncio.sleep(0.002)
        return conn.recv()

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
