"""The audit's errors: what the user must fix or check, said in one line, each with its exit code.

Exit codes of `fanout audit` (docs/audit.md has the table): 0 no gap, 1 a worker missed
invalidations, 2 the user must change an argument or the configuration (bad usage, missing jar,
a database that does not exist, credentials refused), 3 the database could not be reached.
"""

from __future__ import annotations

EXIT_OK, EXIT_GAP, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


class AuditError(Exception):
    """Bad arguments or configuration: the message says what to do."""

    exit_code = EXIT_USAGE


class SourceUnreachable(AuditError):
    """The database did not answer (refused, timed out, unknown host): check it runs and the address."""

    exit_code = EXIT_UNREACHABLE
