"""A logger wrapper that emits at most one line per key per interval, counting the rest."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """`warning(key, msg, *args)` (or `error`): the first occurrence per key and `interval_s` is
    logged, with how many were suppressed since.

    Forged traffic must not be able to flood the log, but an operator must still see that it happens.
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, msg: str, *args: object) -> None:
        self.log(logging.WARNING, key, msg, *args)

    def error(self, key: str, msg: str, *args: object) -> None:
        self.log(logging.ERROR, key, msg, *args)

    def log(self, level: int, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        if len(self._last) > 1000:
            self._last.clear()
            self._suppressed.clear()
        self._last[key] = now
        suppressed = self._suppressed.pop(key, 0)
        suffix = f" ({suppressed} similar suppressed)" if suppressed else ""
        self._logger.log(level, msg + suffix, *args)
