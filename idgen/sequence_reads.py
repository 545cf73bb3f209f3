"""`SequenceReads`: the sequence reads of the generators on one pool, one statement per event-loop
turn.

A reader checks a replicated token against its stream's sequence (`get_max_allocated_token`): a
token above every value ever handed out is forged or corrupt. On a busy reader nearly every new
line is above the last value read, so each line costs a read. A writer's batch arrives as lines of
several streams at once (its events, the caches rows they wrote, ...): their reads, asked for in
the same turn, share one statement, and that statement reads the sequence of every generator on
the pool, so each learns its sequence's value without I/O (`known_allocated_token`) and a later
line at or below it needs no read at all.

A read never joins a statement already sent: a value read before a token was handed out cannot
bound it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg

from idgen.startup import sequence_max_sql


class SequenceReads:
    """`read(sequence)`: the sequence's value, read in a statement sent after the call. A worker
    makes one and gives it to each of its generators (`MultiWriterIdGenerator.create`)."""

    def __init__(self, pool: asyncpg.Pool[Any]) -> None:
        self._pool = pool
        #: sequence (a quoted identifier) -> what learns each value read of it.
        self._learners: dict[str, list[Callable[[int], None]]] = {}
        self._waiting: dict[str, asyncio.Future[int]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Statements sent (each one read every registered sequence).
        self.statements = 0

    def register(self, sequence: str, learn: Callable[[int], None]) -> None:
        """Call `learn` with every value read of `sequence`."""
        self._learners.setdefault(sequence, []).append(learn)

    def read(self, sequence: str) -> asyncio.Future[int]:
        future = self._waiting.get(sequence)
        if future is None:
            loop = asyncio.get_running_loop()
            if not self._waiting:
                loop.call_soon(self._send)
            future = self._waiting[sequence] = loop.create_future()
        return future

    def _send(self) -> None:
        waiting, self._waiting = self._waiting, {}
        task = asyncio.create_task(self._fetch(waiting), name="sequence-reads")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch(self, waiting: dict[str, asyncio.Future[int]]) -> None:
        sequences = sorted(set(waiting) | {s for s, learners in self._learners.items() if learners})
        try:
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow("SELECT " + ", ".join(sequence_max_sql(s) for s in sequences))
        except Exception as e:  # each asker gets it (the database is away, a sequence is gone)
            for future in waiting.values():
                if not future.done():
                    future.set_exception(e)
                    future.exception()  # retrieved: an asker that went away must not log it
            return
        except BaseException:
            for future in waiting.values():
                future.cancel()
            raise
        self.statements += 1
        assert row is not None
        for sequence, value in zip(sequences, row, strict=True):
            for learn in self._learners.get(sequence, ()):
                learn(int(value))
            asked = waiting.get(sequence)
            if asked is not None and not asked.done():
                asked.set_result(int(value))
