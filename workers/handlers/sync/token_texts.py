"""A sync token's text and back, remembered: `TokenTexts`.

A long-poll comes back with the `next_batch` of its last answer, so a worker mostly parses texts
it wrote itself; and the answers of one wake mostly hold one token object (the current one:
`SyncToken.merge` returns it when it covers `since`), so it is encoded once.
"""

from __future__ import annotations

from idgen import InstanceMap, SyncToken
from workers.handlers.caches.lru import CacheCounts

#: Sync tokens remembered by their text (about one per parked client; a few hundred bytes each),
#: the oldest dropped first; `SyncHandler` bounds its merged tokens by it too.
MAX_REMEMBERED_TOKENS = 20_000


class TokenTexts:
    """`encode` and `decode` through the instance map, with the texts handed out or parsed
    lately remembered (a token's text means one token forever: instance ids never change
    meaning)."""

    def __init__(self, instance_map: InstanceMap, stream_order: tuple[str, ...]) -> None:
        self._instance_map = instance_map
        self._order = stream_order
        self._tokens: dict[str, SyncToken] = {}
        self._encoded: tuple[SyncToken | None, str] = (None, "")
        self.counts = CacheCounts("sync_tokens", lambda: len(self._tokens))

    async def encode(self, token: SyncToken) -> str:
        last, text = self._encoded
        if token is last:
            return text
        text = await self._instance_map.encode_sync_token(token, self._order)
        self._encoded = (token, text)
        self._remember(text, token)
        return text

    async def decode(self, text: str) -> SyncToken:
        """A client's token; InvalidTokenError if malformed or naming unknown instances."""
        token = self._tokens.get(text)
        self.counts.hits += token is not None
        if token is None:
            self.counts.misses += 1
            token = await self._instance_map.decode_sync_token(text, self._order)
            self._remember(text, token)
        return token

    def _remember(self, text: str, token: SyncToken) -> None:
        self._tokens[text] = token
        if len(self._tokens) > MAX_REMEMBERED_TOKENS:
            del self._tokens[next(iter(self._tokens))]
