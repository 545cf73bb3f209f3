"""The one base of every error the worker raises on purpose, and the families below it.

Catch `WorkerError` to catch what the application means to say (bad configuration, a refused
request, a persister that is full or stopping, a server that cannot start); anything else is a
bug. The HTTP edge turns these into spec errors; the CLI turns them into one line and an exit code.
"""

from __future__ import annotations


class WorkerError(Exception):
    """Base of the worker's deliberate errors; str(error) is a complete sentence for a person."""


class RoomRuleError(WorkerError):
    """A room rule refused an event (the subclass says which answer the client gets)."""


class PersisterError(WorkerError):
    """The persister cannot take the event now: it is full or stopping; the client may retry."""


class PersisterStopped(PersisterError):
    """The persister is shutting down and takes no new events."""
