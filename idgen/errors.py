"""The one exception hierarchy of `idgen`. Every message says what to do about it."""

from __future__ import annotations


class IdGenError(Exception):
    """Base class of every error raised by `idgen`."""


class NotAWriterError(IdGenError):
    """`get_next` was called on an instance that is not in the stream's `writers` list."""


class InconsistentSequenceError(IdGenError):
    """`stream_positions` is ahead of the stream's Postgres sequence: refusing to start."""


class InvalidTokenError(IdGenError, ValueError):
    """A token's text (or its content) is malformed; the message names the offending part."""


class UnknownInstanceError(IdGenError, LookupError):
    """An instance id is not in the `instance_map` table (or a name has no id yet)."""
