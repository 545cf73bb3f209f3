"""`python -m analytics ...` is `fanout audit ...`."""

import sys

from analytics.cli import main

sys.exit(main(sys.argv[1:]))
