"""The spark-submit entry of the audit (see `make audit-zip` and docs/audit.md for the command line).

A script, not a module to import: spark-submit runs a file, and the package it needs comes from
`--py-files` (the zip `make audit-zip` builds). `fanout audit` and `python -m analytics` run the
same `analytics.cli.main`.
"""

import sys

from analytics.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
