"""Log lines for a worker: text (`time level [instance] logger message`) or one JSON object a line."""

from __future__ import annotations

import json
import logging
import sys

from workers.config import WorkerConfig


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, instance, logger, message (and exc when present)."""

    def __init__(self, instance: str) -> None:
        super().__init__()
        self.instance = instance

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "instance": self.instance,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


def configure_logging(config: WorkerConfig) -> None:
    """Install the root handler once, at the configured level and format: JSON lines on stdout
    (the stream a container's log collector reads as the process's records), text on stderr (a
    person's terminal). A start-up failure's one line stays on stderr either way."""
    handler = logging.StreamHandler(sys.stdout if config.log_format == "json" else sys.stderr)
    if config.log_format == "json":
        handler.setFormatter(JsonFormatter(config.instance_name))
    else:
        fmt = f"%(asctime)s %(levelname)s [{config.instance_name}] %(name)s %(message)s"
        handler.setFormatter(logging.Formatter(fmt))
    logging.basicConfig(level=config.log_level, handlers=[handler])
