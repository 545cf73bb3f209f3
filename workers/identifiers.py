"""Matrix identifiers: user ids, room ids, aliases, event types, as the spec's grammar allows them.

Each `check_*` returns the value or raises ValueError with a message fit for a client; the HTTP
layer turns that into 400 M_INVALID_PARAM (or the errcode the endpoint calls for).
"""

from __future__ import annotations

import os
import random
import re

#: The spec's user id localpart: lowercase letters, digits and `._=-/+`.
_LOCALPART = re.compile(r"^[a-z0-9._=\-/+]+$")
#: A DNS name or IPv4 address with an optional port (no IPv6 literal: see `_OPAQUE`).
_SERVER = re.compile(r"^[A-Za-z0-9.\-]+(:[0-9]{1,5})?$")
#: The opaque part of room ids and aliases, and historical localparts: the characters the events
#: stream's rows carry in ids (`workers.streams.events`), so every id accepted here replicates.
_OPAQUE = re.compile(r"^[A-Za-z0-9_.=\-/+]+$")
MAX_ID_LENGTH = 255
#: Patterns of the ids this module accepts (for property tests).
USER_ID_PATTERN = r"@[a-z0-9._=\-/+]{1,40}:[a-z0-9.\-]{1,30}"
ROOM_ID_PATTERN = r"![A-Za-z0-9_.=\-/+]{1,40}:[a-z0-9.\-]{1,30}"


def user_id(localpart: str, server_name: str) -> str:
    return f"@{localpart}:{server_name}"


def check_localpart(localpart: str, server_name: str) -> str:
    if not localpart or not _LOCALPART.match(localpart):
        raise ValueError("user names use lowercase letters, digits and ._=-/+ only")
    if len(user_id(localpart, server_name)) > MAX_ID_LENGTH:
        raise ValueError(f"user ids are at most {MAX_ID_LENGTH} characters")
    return localpart


def check_user_id(text: str) -> str:
    """A syntactically valid user id `@localpart:server` (historical localparts allowed)."""
    return _sigil_id(text, "@", "a user id (@name:server)")


def localpart_of(user: str, server_name: str) -> str | None:
    """The localpart of `user` when it is a local user id or a bare localpart, else None."""
    if user.startswith("@"):
        local, _, server = user[1:].partition(":")
        return local if server == server_name else None
    return user


def check_room_id(text: str) -> str:
    return _sigil_id(text, "!", "a room id (!opaque:server)")


def check_alias(text: str) -> str:
    return _sigil_id(text, "#", "a room alias (#name:server)")


def _sigil_id(text: str, sigil: str, what: str) -> str:
    """`text` if it is `<sigil><opaque>:<server>` within the length limit; ValueError naming `what`."""
    local, sep, server = text[1:].partition(":")
    if (
        not text.startswith(sigil)
        or not sep
        or not local
        or not _OPAQUE.match(local)
        or not _SERVER.match(server)
        or len(text) > MAX_ID_LENGTH
    ):
        raise ValueError(f"{text[:80]!r} is not {what}")
    return text


def check_event_type(text: str) -> str:
    if not text or len(text) > MAX_ID_LENGTH or not text.isprintable():
        raise ValueError("event types are 1 to 255 printable characters")
    return text


def check_state_key(text: str) -> str:
    if len(text) > MAX_ID_LENGTH or not text.isprintable():
        raise ValueError("state keys are at most 255 printable characters")
    return text


#: The generator of new ids: its own instance, seeded from the OS (and again in a forked child), so
#: nothing that seeds the module-level `random` (a test framework replaying examples) can make two
#: ids collide. Not secret: reading a room takes membership, not knowing its ids.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)
random_bits = _ids.getrandbits


def new_room_id(server_name: str) -> str:
    return f"!{random_bits(96):024x}:{server_name}"
