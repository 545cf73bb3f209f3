"""The one owner of start-up failures: each expected cause becomes one stderr line and an exit code.

Exit 2: the operator must change configuration, flags or environment (a bad or unreadable file,
a duplicate key, a bad value or port number, a malformed FANOUT_* variable, no writer for a stream).
Exit 1: a runtime condition (a server unreachable after the retry window, the HTTP port busy, the
instance name held by another process). Anything not listed here is a bug and keeps its traceback.
docs/operations.md carries the same table; tests/workers/test_startup_errors.py runs every row.
"""

from __future__ import annotations

import errno

from workers.config import ConfigError
from workers.errors import WorkerError
from workers.storage.migrate import SchemaMismatch

CONFIGURATION = 2
RUNTIME = 1


class StartupFailure(WorkerError):
    """A runtime condition that stops start-up; str(error) is the whole line for the operator."""


class Unreachable(StartupFailure):
    """A server stayed unreachable for the whole retry window."""


class NameHeld(StartupFailure):
    """Another live process holds this instance name."""


def describe(error: BaseException) -> tuple[str, int] | None:
    """The stderr line and exit code for an expected start-up failure; None for anything else."""
    if isinstance(error, ConfigError):
        return f"fanout: {error}", CONFIGURATION
    if isinstance(error, StartupFailure):
        return f"fanout: {error}", RUNTIME
    if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
        return f"fanout: HTTP port busy: {error}", RUNTIME
    if isinstance(error, SchemaMismatch):  # deploy another release, or run `fanout migrate`
        return f"fanout: {error}", CONFIGURATION
    return None
