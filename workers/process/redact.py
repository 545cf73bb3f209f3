"""Secrets out of what a command prints: the password of every URL-shaped value becomes '***'."""

from __future__ import annotations

import re
from typing import Any

# scheme://user:password@  (the password is anything up to the last '@' of the authority)
_SECRET_KEY = re.compile(r"secret|password", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@]*:)(?P<secret>[^/]*)@")


def redact_url(value: str) -> str:
    """`value` with a URL's password replaced by '***'; any other string unchanged."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}***@", value, count=1)


def redact(value: Any) -> Any:
    """A copy of a JSON-shaped value with every URL password redacted (strings at any depth), and
    the value of every key that names a secret or password replaced by '***'."""
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, dict):
        return {
            key: "***" if _SECRET_KEY.search(str(key)) and item is not None else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value
