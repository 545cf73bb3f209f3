"""The small integer of each instance name (table `instance_map`), so tokens never carry names.

Ids are assigned once and never change, so both directions are cached forever. Assignment SELECTs
first and only then INSERTs (ON CONFLICT DO NOTHING, then re-SELECTs): an insert that loses a race, or
an upsert of an existing name, would burn a SERIAL value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import asyncpg

from idgen.errors import InvalidTokenError, UnknownInstanceError
from idgen.tokens import MultiWriterStreamToken, SyncToken


class InstanceMap:
    """Async get-or-assign of instance ids, with token encode/decode helpers. `hits` and
    `misses` count the look-ups answered from memory and those that asked the database."""

    __slots__ = ("_ids", "_names", "_pool", "hits", "misses")
    name = "instance_map"
    evictions = invalidations = 0

    def __init__(self, pool: asyncpg.Pool[asyncpg.Record]) -> None:
        self._pool = pool
        self._ids: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._ids)

    def _remember(self, name: str, ident: int) -> int:
        self._ids[name] = ident
        self._names[ident] = name
        return ident

    async def get_id(self, instance_name: str) -> int:
        """The id of `instance_name`, assigning one if it has none yet."""
        cached = self._ids.get(instance_name)
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        select = "SELECT instance_id FROM instance_map WHERE instance_name = $1"
        async with self._pool.acquire() as conn:
            ident = await conn.fetchval(select, instance_name)
            if ident is None:
                ident = await conn.fetchval(
                    "INSERT INTO instance_map (instance_name) VALUES ($1)"
                    " ON CONFLICT (instance_name) DO NOTHING RETURNING instance_id",
                    instance_name,
                )
            if ident is None:
                ident = await conn.fetchval(select, instance_name)
        if ident is None:
            raise UnknownInstanceError(f"could not assign an instance id to {instance_name!r}")
        return self._remember(instance_name, int(ident))

    async def get_name(self, instance_id: int) -> str:
        """The name of `instance_id`; raises UnknownInstanceError if no instance has it."""
        cached = self._names.get(instance_id)
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        name = await self._pool.fetchval(
            "SELECT instance_name FROM instance_map WHERE instance_id = $1", instance_id
        )
        if name is None:
            raise UnknownInstanceError(f"no instance has id {instance_id} in the instance_map table")
        self._remember(str(name), instance_id)
        return str(name)

    async def ids_for(self, names: Iterable[str]) -> Mapping[str, int]:
        return {n: await self.get_id(n) for n in set(names)}

    async def names_for(self, ids: Iterable[int]) -> Mapping[int, str]:
        """Names of the given ids; an unknown id raises InvalidTokenError (it came from a client)."""
        result: dict[int, str] = {}
        for i in set(ids):
            try:
                result[i] = await self.get_name(i)
            except UnknownInstanceError as e:
                raise InvalidTokenError(str(e)) from None
        return result

    async def encode_token(self, token: MultiWriterStreamToken) -> str:
        return token.to_string(await self.ids_for(token.instance_map))

    async def decode_token(self, text: str) -> MultiWriterStreamToken:
        _, entries = MultiWriterStreamToken.parse_ids(text)
        return MultiWriterStreamToken.parse(text, await self.names_for(entries))

    async def encode_sync_token(self, token: SyncToken, stream_order: list[str] | tuple[str, ...]) -> str:
        names = [n for s in token.streams() for n in token.get(s).instance_map]
        return token.to_string(stream_order, await self.ids_for(names))

    async def decode_sync_token(self, text: str, stream_order: list[str] | tuple[str, ...]) -> SyncToken:
        structure = SyncToken.parse_ids(text, stream_order)
        ids = [i for _, entries in structure.values() for i in entries]
        return SyncToken.parse(text, stream_order, await self.names_for(ids))
