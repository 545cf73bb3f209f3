"""`answer_key`: which /sync answers readers may share, and `SharedAnswers`: one body, one
encoding, a bound on what it keeps."""

from __future__ import annotations

import json

from workers.handlers.sync.filter import SyncFilter
from workers.handlers.sync.shared_answers import SharedAnswers, answer_key
from workers.handlers.sync.stored_sections import StoredUpdates
from workers.model import MEMBER_EVENT, Event

BOB = "@bob:t"
MESSAGE = Event(1, "w1", "$m", "!r:t", "m.room.message", "@alice:t", {"body": "hi"}, None, 0)


def _member(user_id: str, membership: str) -> Event:
    return Event(
        2, "w1", f"${user_id}", "!r:t", MEMBER_EVENT, user_id, {"membership": membership}, user_id, 0
    )


def _key(events: list[Event], *, own_news: bool = False, stored: StoredUpdates | None = None) -> object:
    return answer_key(
        BOB, "s1", SyncFilter(), events, own_news, StoredUpdates() if stored is None else stored
    )


def test_the_same_window_token_filter_and_key_counts_give_one_key_for_any_reader() -> None:
    assert _key([MESSAGE]) is not None
    assert _key([MESSAGE]) == answer_key("@carol:t", "s1", SyncFilter(), [MESSAGE], False, StoredUpdates())
    # Another member's join is the same news for every reader.
    assert _key([MESSAGE, _member("@dave:t", "join")]) is not None


def test_what_makes_an_answer_the_readers_own_leaves_it_unshared() -> None:
    for membership in ("join", "leave", "invite", "ban", "knock"):
        assert _key([MESSAGE, _member(BOB, membership)]) is None
    assert _key([MESSAGE], own_news=True) is None  # typing, presence or full_state
    for news in (
        StoredUpdates(account_data=[{"type": "m.x", "content": {}}]),
        StoredUpdates(to_device=[{"type": "m.x", "content": {}, "sender": "@a:t"}]),
        StoredUpdates(changed=["@a:t"]),
        StoredUpdates(left=["@a:t"]),
        StoredUpdates(receipts={"!r:t": {"type": "m.receipt", "content": {}}}),
        StoredUpdates(room_account_data={"!r:t": [{"type": "m.x", "content": {}}]}),
    ):
        assert _key([MESSAGE], stored=news) is None


def test_a_different_token_filter_window_or_key_count_is_a_different_key() -> None:
    base = _key([MESSAGE])
    other_filter = SyncFilter.parse({"room": {"timeline": {"limit": 3}}})
    assert answer_key(BOB, "s2", SyncFilter(), [MESSAGE], False, StoredUpdates()) != base
    assert answer_key(BOB, "s1", other_filter, [MESSAGE], False, StoredUpdates()) != base
    assert _key([]) != base
    assert _key([MESSAGE], stored=StoredUpdates(one_time_key_counts={"signed_curve25519": 1})) != base
    assert _key([MESSAGE], stored=StoredUpdates(unused_fallback_key_types=[])) != base
    # Equal filters parsed apart are one key (uploaded filters of different users, say).
    assert answer_key(BOB, "s1", SyncFilter.parse({}), [MESSAGE], False, StoredUpdates()) == base


def test_a_kept_body_is_handed_out_and_encoded_once_and_the_oldest_goes_first() -> None:
    answers = SharedAnswers(max_entries=2)
    bodies = [{"next_batch": str(n)} for n in range(3)]
    assert answers.get("a") is None
    answers.keep("a", bodies[0])
    answers.keep(None, bodies[1])  # not shareable: not kept
    assert answers.get("a") is bodies[0] and answers.get(None) is None
    encoded = answers.encode(bodies[0])
    assert json.loads(encoded) == bodies[0] and answers.encode(bodies[0]) is encoded
    assert answers.encode(bodies[1]) is not answers.encode(bodies[1])  # not kept: encoded each time
    answers.keep("b", bodies[1])
    answers.keep("c", bodies[2])
    assert answers.get("a") is None and answers.get("b") is bodies[1] and answers.get("c") is bodies[2]
    assert (answers.built, answers.shared) == (3, 3)
