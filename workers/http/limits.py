"""Request limits at the HTTP layer, answered without a traceback.

aiohttp's parser refuses a request line longer than `max_line_size` or a header longer than
`max_field_size` with a 400 before any handler runs, and then logs the parser error with a
traceback through its server logger. That error is expected from the internet, so
`ExpectedErrorLogger` (handed to aiohttp as its server logger) turns it into one counted warning
at most every `LOG_EVERY_S` seconds; any other exception keeps its traceback.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)
LOG_EVERY_S = 10.0


class ExpectedErrorLogger(logging.Logger):
    """aiohttp's server logger with malformed or oversized requests counted, not traced."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__("aiohttp.server")
        self.parent = logging.getLogger("aiohttp")
        self.refused = Counter(
            "fanout_http_requests_refused_total",
            "Requests the HTTP parser refused (oversized line or header, malformed)",
            ["reason"],
            registry=registry,
        )
        self._last_log = 0.0
        self._unlogged = 0

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if not isinstance(exc_info, HttpProcessingError):
            super().exception(msg, *args, exc_info=exc_info, **kwargs)
            return
        reason = type(exc_info).__name__
        self.refused.labels(reason).inc()
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            log.warning(
                "refused %d malformed or oversized request(s) (last: %s %s)",
                self._unlogged, reason, str(exc_info.message)[:80],
            )  # fmt: skip
            self._last_log = now
            self._unlogged = 0


def runner_limits(registry: CollectorRegistry, max_line_bytes: int, max_header_bytes: int) -> dict[str, Any]:
    """Keyword arguments for `web.AppRunner`: the parser's limits and the quiet logger."""
    return {
        "max_line_size": max_line_bytes,
        "max_field_size": max_header_bytes,
        "logger": ExpectedErrorLogger(registry),
    }
