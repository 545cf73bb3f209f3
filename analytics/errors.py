"""The audit's one error base: what the user must fix, said in one line, with the exit code it gets."""

from __future__ import annotations


class AuditError(Exception):
    """Bad arguments or configuration (missing jar, unreachable database): the message says what to do."""
