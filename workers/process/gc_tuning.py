"""Garbage-collector and allocator settings for long-running worker processes."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

#: Young objects allocated between collections (Python's default is 700).
YOUNG_THRESHOLD = 10_000
#: glibc's M_MMAP_THRESHOLD parameter, and the value it starts with (128 KiB).
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 128 * 1024


def tune_gc() -> None:
    """Call once start-up is done. What start-up loaded (modules, models, pools) lives as long as
    the process: `gc.freeze()` keeps it out of every later collection. Young objects are collected
    every 10,000 allocations instead of 700: each event or replicated row allocates dozens. With
    the defaults the collector took about 12% of a persister's CPU in `fanout bench cluster` (a
    third of that after the freeze alone)."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 10, 10)
    return_large_blocks()


def return_large_blocks() -> None:
    """Keep glibc's mmap threshold at 128 KiB. By default glibc raises it to the size of the largest
    block freed, after which such blocks come from the heap and stay there: each password hash
    (argon2, 19 MiB, in the default executor's threads) then left 19 MiB in each thread's arena,
    114 MB of a sync worker's RSS after a few logins. Pinned, they go back to the system when
    freed. Does nothing on a C library without `mallopt`."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    except (OSError, AttributeError):
        return
