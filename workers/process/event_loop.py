"""The event loop every fanout process runs on: uvloop when it is installed, else asyncio's own.

uvloop runs the loop's machinery in C: each future resolved, task woken and socket written costs a
Python-level Handle, `call_soon` and selector round in asyncio's loop. On the persister's write
path that was 12% of its instructions per event (`fanout bench instructions`: 81,700 -> 72,200).
Benchmarks run their ceilings on the same loop, so a figure never compares two loops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

try:
    from uvloop import run as _uvloop_run
except ImportError:  # not built for this platform (uvloop has no Windows wheels)
    _uvloop_run = None  # type: ignore[assignment]


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool = True) -> T:
    """`asyncio.run(main)`, on uvloop when it is installed (and `use_uvloop`)."""
    if use_uvloop and _uvloop_run is not None:
        return _uvloop_run(main)
    return asyncio.run(main)


def name() -> str:
    """Which loop runs the calling code (for start-up logs)."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
