"""Which persister owns a room: every event of a room goes through one writer.

That is what makes per-writer tokens enough for visibility: when a reader's token covers an event
of writer W, it covers every earlier event of that room too (W's position only passes finished
IDs), so a membership change can never land "behind" an event a reader already got.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def writer_for_room(room_id: str, writers: Sequence[str]) -> str:
    """A stable choice among `writers` (in configured order) for `room_id`."""
    if not writers:
        raise ValueError("the events stream has no configured writers")
    digest = hashlib.blake2b(room_id.encode(), digest_size=8).digest()
    return writers[int.from_bytes(digest, "big") % len(writers)]
