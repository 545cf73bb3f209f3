"""workers.process.log_format: JSON records on stdout (a container's log collector reads them as the
process's records), text on stderr (a person's terminal)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = (
    "import logging, sys;"
    "from workers.config import WorkerConfig;"
    "from workers.process.log_format import configure_logging;"
    "configure_logging(WorkerConfig(instance_name='w1', database_url='postgresql://h/d',"
    " redis_url='redis://h', stream_writers={'events': ['w1']}, log_format=sys.argv[1]));"
    "logging.getLogger('probe').warning('hello %s', 'there')"
)


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_records_go_where_their_format_says(log_format: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, log_format], capture_output=True, text=True, check=True
    )
    if log_format == "json":
        assert done.stderr == ""
        record = json.loads(done.stdout)
        assert record | {"time": None} == {
            "time": None, "level": "WARNING", "instance": "w1", "logger": "probe", "message": "hello there",
        }  # fmt: skip
    else:
        assert done.stdout == ""
        assert done.stderr.rstrip().endswith("WARNING [w1] probe hello there")
