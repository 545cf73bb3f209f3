"""The exceptions of `pubsub`; every one says what went wrong and what to do."""

from __future__ import annotations


class PubSubError(Exception):
    """Base class of everything `pubsub` raises on purpose."""


class WireError(PubSubError):
    """A line is not a valid command. `reason` is a short code used as the rejection metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class StreamConfigError(PubSubError):
    """A stream or the replication client is set up wrongly (unknown stream, duplicate name, ...)."""


class LateRowsError(PubSubError):
    """Rows were staged for a token the publisher has already announced: stage before finishing the ID."""


class DependencyError(PubSubError):
    """A row names a dependency this reader cannot meet truthfully (a token beyond the stream's
    sequence): the row is not applied and its writer waits for its next POSITION."""
