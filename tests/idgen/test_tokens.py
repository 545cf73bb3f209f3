"""Token algebra and text forms: examples, rejections, hypothesis properties; InstanceMap on Postgres."""

from __future__ import annotations

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from idgen import InstanceMap, InvalidTokenError, MultiWriterStreamToken, SyncToken, UnknownInstanceError

NAMES = ["master", "persister1", "persister2", "persister3"]
IDS = {n: i + 1 for i, n in enumerate(NAMES)}
BY_ID = {i: n for n, i in IDS.items()}
ORDER = ("events", "caches")


@st.composite
def tokens(draw: st.DrawFn) -> MultiWriterStreamToken:
    stream = draw(st.integers(0, 50))
    ahead = draw(st.dictionaries(st.sampled_from(NAMES), st.integers(stream + 1, stream + 30)))
    return MultiWriterStreamToken(stream, ahead)


sync_tokens = st.builds(lambda e, c: SyncToken({"events": e, "caches": c}), tokens(), tokens())


def test_text_forms() -> None:
    assert MultiWriterStreamToken(12).to_string(IDS) == "s12"
    token = MultiWriterStreamToken(56, {"persister2": 59, "persister1": 58})
    assert token.to_string(IDS) == "m56~2.58~3.59"
    assert MultiWriterStreamToken.parse("m56~2.58~3.59", BY_ID) == token
    sync = SyncToken({"events": token, "caches": MultiWriterStreamToken(7)})
    assert sync.to_string(ORDER, IDS) == "m56~2.58~3.59_s7"
    assert SyncToken.parse("m56~2.58~3.59", ORDER, BY_ID) == SyncToken({"events": token})  # caches: s0


@pytest.mark.parametrize(
    "text",
    ["", "12", "s", "s-1", "s01", "s1x", "t1-2", "m5", "m5~", "m5~1", "m5~1.5", "m5~1.4", "m5~1.7~1.8",
     "m5~9.7", "s99999999999999999999", "m5~1.7~"],
)  # fmt: skip
def test_malformed_stream_tokens_are_rejected(text: str) -> None:
    with pytest.raises(InvalidTokenError, match="invalid stream token"):
        MultiWriterStreamToken.parse(text, BY_ID)


@pytest.mark.parametrize(
    "text", ["", "s1__s2", "s1_x", "s1 _s2", "s1_s2_x", "s1_s2_m3", "_".join(["s1"] * (len(ORDER) + 17))]
)
def test_malformed_sync_tokens_are_rejected(text: str) -> None:
    with pytest.raises(InvalidTokenError):
        SyncToken.parse(text, ORDER, BY_ID)


def test_tokens_of_the_previous_and_the_next_release_are_read() -> None:
    """Streams are only appended: an older token lacks trailing components (they are at s0), a
    newer one has more (checked for form, then left out)."""
    newer = SyncToken.parse("m5~2.7_s2_m9~77.10_s4", ORDER, BY_ID)  # 77: an id only the newer knows
    assert newer == SyncToken(
        {"events": MultiWriterStreamToken(5, {"persister1": 7}), "caches": MultiWriterStreamToken(2)}
    )
    assert newer.to_string(ORDER, IDS) == "m5~2.7_s2"
    assert SyncToken.parse("s5", ORDER, BY_ID).get("caches") == MultiWriterStreamToken(0)
    assert SyncToken.parse("_".join(["s1"] * (len(ORDER) + 16)), ORDER, BY_ID) == SyncToken.parse(
        "s1_s1", ORDER, BY_ID
    )


def test_invariant_entries_above_stream() -> None:
    with pytest.raises(InvalidTokenError, match="not ahead"):
        MultiWriterStreamToken(5, {"master": 5})
    assert MultiWriterStreamToken.from_positions(5, {"master": 5, "persister1": 6}).instance_map == {
        "persister1": 6
    }
    with pytest.raises(UnknownInstanceError):
        MultiWriterStreamToken(1, {"stranger": 2}).to_string(IDS)


def test_order_and_bound_examples() -> None:
    a = MultiWriterStreamToken(5, {"master": 8})
    b = MultiWriterStreamToken(6, {"persister1": 7})
    assert not a.is_before_or_eq(b) and not b.is_before_or_eq(a)  # a partial order
    merged = a.copy_and_advance(b)
    assert merged == MultiWriterStreamToken(6, {"master": 8, "persister1": 7})
    assert merged.get_max_stream_pos() == 8
    assert merged.bound_stream_token(7) == MultiWriterStreamToken(6, {"master": 7, "persister1": 7})
    assert merged.bound_stream_token(5) == MultiWriterStreamToken(5)
    assert merged.bound_stream_token(9) is merged


@given(tokens(), tokens(), tokens())
def test_advance_is_a_join(
    a: MultiWriterStreamToken, b: MultiWriterStreamToken, c: MultiWriterStreamToken
) -> None:
    assert a.copy_and_advance(b) == b.copy_and_advance(a)
    assert a.copy_and_advance(b).copy_and_advance(c) == a.copy_and_advance(b.copy_and_advance(c))
    assert a.copy_and_advance(a) == a
    joined = a.copy_and_advance(b)
    assert a.is_before_or_eq(joined) and b.is_before_or_eq(joined)
    assert a.is_before_or_eq(b) == (joined == b)


@given(tokens(), st.integers(0, 90))
def test_bound_never_exceeds_max(token: MultiWriterStreamToken, limit: int) -> None:
    bounded = token.bound_stream_token(limit)
    assert bounded.get_max_stream_pos() <= max(limit, 0) or bounded is token
    assert bounded.is_before_or_eq(token)


@given(tokens())
def test_stream_token_text_round_trips(token: MultiWriterStreamToken) -> None:
    text = token.to_string(IDS)
    assert MultiWriterStreamToken.parse(text, BY_ID) == token
    assert MultiWriterStreamToken.parse(text, BY_ID).to_string(IDS) == text


@given(sync_tokens, sync_tokens, sync_tokens)
def test_sync_token_join_and_round_trip(a: SyncToken, b: SyncToken, c: SyncToken) -> None:
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    assert a.merge(a) == a
    assert a.is_before_or_eq(a.merge(b))
    text = a.to_string(ORDER, IDS)
    assert all(ch.isalnum() or ch in "-._~" for ch in text)  # RFC 3986 unreserved: no escaping
    assert SyncToken.parse(text, ORDER, BY_ID) == a


@given(sync_tokens, sync_tokens)
def test_a_merge_that_moves_nothing_is_the_token_itself(a: SyncToken, b: SyncToken) -> None:
    """/sync encodes the current token once per wake because of this: `merge` hands back the very
    object when it covers the other token, and a new one exactly when a component moved."""
    merged = a.merge(b)
    assert (merged is a) == (b.is_before_or_eq(a) and set(b.streams()) <= set(a.streams()))
    assert merged == a.merge(b.merge(b))


async def test_instance_map_assigns_once_and_decodes(db_pool: asyncpg.Pool) -> None:
    imap = InstanceMap(db_pool)
    first = await imap.get_id("master")
    assert await imap.get_id("master") == first
    other = await InstanceMap(db_pool).get_id("persister1")  # a second process: no cache
    assert await InstanceMap(db_pool).get_id("master") == first
    assert other == first + 1  # no serial value burned by the repeated lookups
    token = MultiWriterStreamToken(3, {"persister1": 9})
    text = await imap.encode_token(token)
    assert text == f"m3~{other}.9"
    assert await InstanceMap(db_pool).decode_token(text) == token
    sync = SyncToken({"events": token})
    assert (
        await InstanceMap(db_pool).decode_sync_token(await imap.encode_sync_token(sync, ORDER), ORDER) == sync
    )
    with pytest.raises(InvalidTokenError, match="no instance has id 999"):
        await imap.decode_token("m3~999.9")
