"""A sync token's text and back, remembered: the current token encoded once per wake, a text
this worker wrote parsed from memory, another worker's parsed once, the memory bounded."""

from __future__ import annotations

import asyncpg
import pytest

from idgen import InstanceMap, InvalidTokenError, MultiWriterStreamToken, SyncToken
from workers.handlers.sync import token_texts
from workers.handlers.sync.token_texts import TokenTexts

ORDER = ("events", "caches")


class CountingMap(InstanceMap):
    """The real instance map, counting the encodes and decodes that reach it."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool)
        self.encodes = self.decodes = 0

    async def encode_sync_token(self, token: SyncToken, stream_order: list[str] | tuple[str, ...]) -> str:
        self.encodes += 1
        return await super().encode_sync_token(token, stream_order)

    async def decode_sync_token(self, text: str, stream_order: list[str] | tuple[str, ...]) -> SyncToken:
        self.decodes += 1
        return await super().decode_sync_token(text, stream_order)


async def test_texts_are_remembered_both_ways(db_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    imap = CountingMap(db_pool)
    texts = TokenTexts(imap, ORDER)
    current = SyncToken({"events": MultiWriterStreamToken(5, {"persister1": 7})})
    since = SyncToken({"events": MultiWriterStreamToken(4)})
    assert current.merge(since) is current  # what a wake's answers hold: one object
    text = await texts.encode(current)
    assert await texts.encode(current.merge(since)) == text and imap.encodes == 1
    equal = SyncToken({"events": MultiWriterStreamToken(5, {"persister1": 7})})
    assert await texts.encode(equal) == text and imap.encodes == 2  # another object: encoded again
    assert await texts.decode(text) == current and imap.decodes == 0  # written here: from memory
    elsewhere = await InstanceMap(db_pool).encode_sync_token(since, ORDER)  # another worker's
    assert await texts.decode(elsewhere) == since and await texts.decode(elsewhere) == since
    assert imap.decodes == 1 and (texts.counts.hits, texts.counts.misses) == (2, 1)
    with pytest.raises(InvalidTokenError):
        await texts.decode("m1~999999.2")  # an instance id no worker has
    monkeypatch.setattr(token_texts, "MAX_REMEMBERED_TOKENS", 2)
    for position in range(6, 10):
        await texts.encode(SyncToken({"events": MultiWriterStreamToken(position)}))
    assert len(texts._tokens) == 2
