"""A lane: the few pool connections an ID generator keeps while it is busy.

Every asyncpg pool acquire and release costs a reset round trip; a writer allocating IDs back to
back would pay it twice per allocation. A lane keeps up to `size` connections taken from the pool
while they are in use and gives each back after `idle_s` without use (or at `close()`), so a busy
writer reuses its connections and an idle one holds none. A connection that failed or was
interrupted is given back to the pool at once (which resets or drops it).

A kept connection can die while idle (its backend terminated, its link cut): asyncpg then hands
it back to the pool itself and detaches it, and any later call on it raises "connection has been
released back to the pool". The lane never hands out such a connection: it forgets it and takes
another.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, TypeAlias

import asyncpg

from idgen.errors import IdGenError

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Connection: TypeAlias = PoolConnectionProxy[asyncpg.Record]


class Lane:
    """Up to `size` pool connections kept while in use, given back after `idle_s` without use."""

    __slots__ = (
        "_background",
        "_closed",
        "_held",
        "_idle",
        "_idle_s",
        "_pool",
        "_size",
        "_timer",
        "_waiters",
    )

    def __init__(self, pool: asyncpg.Pool[asyncpg.Record], size: int, idle_s: float) -> None:
        self._pool = pool
        self._size = size
        self._idle_s = idle_s
        self._idle: list[tuple[Connection, float]] = []
        self._held = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False

    def acquire_idle(self) -> Connection | None:
        """A kept connection if one is idle right now (no await: the common case), else None."""
        if self._closed:
            raise IdGenError("the ID generator is closed")
        return self._pop_idle()

    def _pop_idle(self) -> Connection | None:
        """The most recently used idle connection that is still alive; dead ones are dropped."""
        while self._idle:
            conn = self._idle.pop()[0]
            if alive(conn):
                return conn
            self.discard(conn)
        return None

    async def acquire(self) -> Connection:
        while True:
            if self._closed:
                raise IdGenError("the ID generator is closed")
            conn = self._pop_idle()
            if conn is not None:
                return conn
            if self._held < self._size:
                self._held += 1
                try:
                    return await self._pool.acquire()
                except BaseException:
                    self._held -= 1
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def release(self, conn: Connection) -> None:
        if self._closed or not alive(conn):
            self.discard(conn)
            return
        loop = asyncio.get_running_loop()
        self._idle.append((conn, loop.time()))
        if self._waiters:
            self._wake()
        if self._timer is None:
            self._timer = loop.call_later(self._idle_s, self._expire)

    def discard(self, conn: Connection) -> None:
        """Give a connection that failed or was interrupted back to the pool (which resets or drops
        it; a no-op for one asyncpg already took back)."""
        self._held -= 1
        task = asyncio.get_running_loop().create_task(self._pool.release(conn))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
                return

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        cutoff = loop.time() - self._idle_s
        keep = [(c, t) for c, t in self._idle if t > cutoff]
        for conn, t in self._idle:
            if t <= cutoff:
                self.discard(conn)
        self._idle = keep
        if keep:
            self._timer = loop.call_later(self._idle_s, self._expire)

    async def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            self.discard(conn)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def alive(conn: Connection) -> bool:
    """Whether `conn` can still run a query: not closed, and not taken back by the pool (asyncpg
    detaches a pool connection whose link was lost; every call on it then raises InterfaceError)."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False
