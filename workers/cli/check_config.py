"""`fanout check-config FILE`: validate a worker configuration and print it resolved (env applied),
with the password of every URL replaced by '***'."""

from __future__ import annotations

import argparse
import json
import sys

from workers.config import ConfigError, load_config
from workers.redact import redact


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout check-config", description=__doc__)
    p.add_argument("config", help="YAML file; FANOUT_* environment variables override its fields")
    args = p.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"fanout: {e}", file=sys.stderr)
        return 2
    print(json.dumps(redact(config.model_dump(mode="json")), indent=2))
    return 0
