"""The one owner of start-up failures: each expected cause becomes one stderr line and an exit code.

Exit 2: the operator must change configuration, flags or environment (a bad or unreadable file,
a duplicate key, a bad value or port number, a malformed FANOUT_* variable, no writer for a stream),
or a server refused what the configuration says (`refusal`: credentials, a database that does not
exist, a server at the Redis URL that does not speak Redis). These are never retried.
Exit 1: a runtime condition (a server unreachable after the retry window, the HTTP port busy, the
instance name held by another process). Anything not listed here is a bug and keeps its traceback.
docs/operations.md carries the same table; tests/workers/process/test_startup_errors.py runs every row.
"""

from __future__ import annotations

import errno

import asyncpg
import redis.exceptions

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


class Refused(StartupFailure):
    """A server refused what the configuration says: retrying cannot help (exit 2)."""


def refusal(error: BaseException) -> str | None:
    """Why a connection attempt failed for good, when the configuration is at fault; None when
    the failure may pass (a server starting, restarting or behind a proxy that is not yet up).

    A connection closed without any answer stays retryable: a container's port proxy does that
    while Redis is still starting."""
    if isinstance(error, asyncpg.InvalidCatalogNameError):
        return f"{error} (create it, or fix database_url)"
    if isinstance(error, asyncpg.InvalidAuthorizationSpecificationError):  # password, role, pg_hba
        return f"login refused: {error} (fix the user or password in database_url)"
    if isinstance(error, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError):
        return f"credentials refused: {error} (fix the user or password in redis_url)"
    if isinstance(error, redis.exceptions.InvalidResponse):
        return f"not a Redis server: {error} (is redis_url the Redis port?)"
    return None


#: How the stderr line of a worker whose HTTP port another process holds begins (a harness that
#: picked the port reads it to pick again).
PORT_BUSY = "fanout: HTTP port busy"


def describe(error: BaseException) -> tuple[str, int] | None:
    """The stderr line and exit code for an expected start-up failure; None for anything else."""
    if isinstance(error, ConfigError | Refused):
        return f"fanout: {error}", CONFIGURATION
    if isinstance(error, StartupFailure):
        return f"fanout: {error}", RUNTIME
    if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
        return f"{PORT_BUSY}: {error}", RUNTIME
    if isinstance(error, SchemaMismatch):  # deploy another release, or run `fanout migrate`
        return f"fanout: {error}", CONFIGURATION
    return None
