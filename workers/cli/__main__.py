"""`python -m workers.cli` is the `fanout` command."""

import sys

from workers.cli import main

sys.exit(main())
