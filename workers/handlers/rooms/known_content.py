"""The form a client's event must give the content types the server itself reads.

The auth rules accept any content for these types; the client API refuses some (400) because the
server, or every client after it, would act on them: a server ACL that shuts this server out of
its own room, mentions that clients read as a list of user ids, a retention policy the purge jobs
read as integers. Synapse refuses the same events in its event validator. Plain functions over
the content: no I/O, no room state.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

SERVER_ACL_EVENT = "m.room.server_acl"
RETENTION_EVENT = "m.room.retention"
MENTIONS = "m.mentions"


def problem(event_type: str, content: Mapping[str, Any], state_key: str | None, sender: str) -> str | None:
    """Why the client API refuses this content (400), or None. `sender` is a local user: its
    server is the one a server ACL must leave in."""
    if event_type == SERVER_ACL_EVENT and not acl_admits(content, sender.partition(":")[2]):
        return "a server ACL that denies this server cannot be sent from it"
    if event_type == RETENTION_EVENT:
        if state_key is None:
            return f"{RETENTION_EVENT} is a state event"
        if (found := _retention_problem(content)) is not None:
            return found
    if MENTIONS in content:
        return _mentions_problem(content[MENTIONS])
    return None


def acl_admits(content: Mapping[str, Any], server_name: str) -> bool:
    """Whether a server ACL's content lets `server_name` take part (port not considered). As the
    spec says: an IP literal is refused unless `allow_ip_literals` (default true), then a name a
    `deny` glob matches is refused, then one an `allow` glob matches is admitted; no match, refused.
    Globs take `*` and `?` and ignore case. A value of the wrong type counts as its default, and a
    glob that is not a string matches nothing (the event is valid whatever its content)."""
    host = _host(server_name)
    literals = content.get("allow_ip_literals", True)
    if literals is False and _is_ip_literal(host):
        return False
    if any(_glob(entry).fullmatch(host) for entry in _strings(content.get("deny"))):
        return False
    return any(_glob(entry).fullmatch(host) for entry in _strings(content.get("allow")))


def _host(server_name: str) -> str:
    if server_name.startswith("["):  # an IPv6 literal, maybe with a port after the bracket
        return server_name[: server_name.find("]") + 1] or server_name
    return server_name.rpartition(":")[0] if ":" in server_name else server_name


def _is_ip_literal(host: str) -> bool:
    if host.startswith("["):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


@lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    parts = ("." if c == "?" else ".*" if c == "*" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL)


def _retention_problem(content: Mapping[str, Any]) -> str | None:
    bounds = {key: content.get(key) for key in ("min_lifetime", "max_lifetime")}
    for key, value in bounds.items():
        if value is not None and type(value) is not int:
            return f"{RETENTION_EVENT}'s {key} is an integer (milliseconds)"
    low, high = bounds["min_lifetime"], bounds["max_lifetime"]
    if low is not None and high is not None and low > high:
        return f"{RETENTION_EVENT}'s min_lifetime is above its max_lifetime"
    return None


def _mentions_problem(mentions: Any) -> str | None:
    if not isinstance(mentions, dict):
        return f"{MENTIONS} is an object"
    user_ids = mentions.get("user_ids")
    if "user_ids" in mentions and (
        not isinstance(user_ids, list) or not all(isinstance(u, str) for u in user_ids)
    ):
        return f"{MENTIONS}.user_ids is a list of user ids"
    if "room" in mentions and not isinstance(mentions["room"], bool):
        return f"{MENTIONS}.room is true or false"
    return None
