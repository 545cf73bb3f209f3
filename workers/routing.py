"""Which writer owns a room, or a user's data: every write of one key goes through one writer.

For rooms that is what makes per-writer tokens enough for visibility: when a reader's token covers
an event of writer W, it covers every earlier event of that room too (W's position only passes
finished IDs), so a membership change can never land "behind" an event a reader already got. For
the user-keyed streams (account data, device lists, to-device) it keeps one user's changes in the
order they were made, while the writers share the users between them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def _stable_choice(key: str, writers: Sequence[str], what: str) -> str:
    if not writers:
        raise ValueError(f"the {what} stream has no configured writers")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return writers[int.from_bytes(digest, "big") % len(writers)]


def writer_for_room(room_id: str, writers: Sequence[str]) -> str:
    """A stable choice among `writers` (in configured order) for `room_id`."""
    return _stable_choice(room_id, writers, "events")


def writer_for_user(user_id: str, writers: Sequence[str], stream: str) -> str:
    """A stable choice among `writers` of `stream` (in configured order) for `user_id`'s writes."""
    return _stable_choice(user_id, writers, stream)
