"""Vector-clock stream tokens and the composite sync token, with their URL-safe text forms.

`MultiWriterStreamToken(stream, instance_map)`: every writer has persisted everything up to `stream`;
`instance_map` lists only the writers known to be further ahead (each value > `stream`).

Text form of one stream token:
* `s<N>` when no writer is ahead of N;
* `m<N>~<id>.<pos>~<id>.<pos>...` otherwise, entries in ascending `<id>` order, where `<id>` is the
  instance's small integer from the `instance_map` table (names never appear in tokens).

`SyncToken` has one stream token per stream, in an order the application fixes (e.g. `("events",
"caches")`), joined by `_`: `s12_m5~1.7~2.9`. Every character is RFC 3986 "unreserved", so the token needs
no escaping in a URL. Parsing is strict: anything malformed raises InvalidTokenError naming the
offending part.

Across one release (a rolling upgrade serves a client from both), streams are only appended to the
order, never removed or reordered. So a token of the previous release lacks trailing components:
they parse as `s0` (the stream did not exist). A token of the next release has more: up to
`MAX_NEWER_COMPONENTS` trailing ones, checked for form and then ignored (the next `next_batch`
this release issues leaves them out, so the newer worker resends that stream's items from its
start rather than the client starting over).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

from idgen.errors import InvalidTokenError, UnknownInstanceError

_NUM = r"(0|[1-9][0-9]{0,18})"
_S_FORM = re.compile(rf"s{_NUM}")
_M_HEAD = re.compile(rf"m{_NUM}")
_M_ENTRY = re.compile(rf"{_NUM}\.{_NUM}")
_MAX_POS = 2**63 - 1
#: How many trailing components of streams this release does not know a token may carry.
MAX_NEWER_COMPONENTS = 16


class PositionSource(Protocol):
    """What `MultiWriterStreamToken.from_generator` needs (a `MultiWriterIdGenerator` fits)."""

    def get_current_token(self) -> int: ...
    def get_positions(self) -> dict[str, int]: ...


class MultiWriterStreamToken:
    """An immutable vector clock over the writers of one stream. Positions are non-negative."""

    __slots__ = ("_map", "_stream")

    def __init__(self, stream: int, instance_map: Mapping[str, int] | None = None) -> None:
        """Raises InvalidTokenError if `stream` is negative or an entry is not above `stream`."""
        if stream < 0:
            raise InvalidTokenError(f"stream position must be >= 0, got {stream}")
        entries = dict(instance_map or {})
        for name, pos in entries.items():
            if pos <= stream:
                raise InvalidTokenError(
                    f"instance {name!r} at {pos} is not ahead of the stream position {stream}"
                )
        self._stream = stream
        self._map = entries

    @classmethod
    def from_positions(cls, stream: int, positions: Mapping[str, int]) -> MultiWriterStreamToken:
        """Like the constructor, but drops entries at or below `stream` instead of rejecting them."""
        return cls(stream, {n: p for n, p in positions.items() if p > stream})

    @classmethod
    def from_generator(cls, gen: PositionSource) -> MultiWriterStreamToken:
        """The current token of a generator: persisted-upto plus every writer known to be ahead."""
        return cls.from_positions(gen.get_current_token(), gen.get_positions())

    @property
    def stream(self) -> int:
        return self._stream

    @property
    def instance_map(self) -> Mapping[str, int]:
        return MappingProxyType(self._map)

    def get_stream_pos_for_instance(self, instance_name: str) -> int:
        return self._map.get(instance_name, self._stream)

    def get_max_stream_pos(self) -> int:
        return max(self._map.values(), default=self._stream)

    def is_before_or_eq(self, other: MultiWriterStreamToken) -> bool:
        """True iff every writer's position here is <= its position in `other` (a partial order)."""
        if self._stream > other._stream:
            return False
        return all(pos <= other.get_stream_pos_for_instance(name) for name, pos in self._map.items())

    def copy_and_advance(self, other: MultiWriterStreamToken) -> MultiWriterStreamToken:
        """The component-wise maximum: commutative, associative, idempotent."""
        if other.is_before_or_eq(self):
            return self  # the common case at /sync (the current token covers `since`): no new token
        if self.is_before_or_eq(other):
            return other
        stream = max(self._stream, other._stream)
        merged: dict[str, int] = {}
        for name in self._map.keys() | other._map.keys():
            pos = max(self.get_stream_pos_for_instance(name), other.get_stream_pos_for_instance(name))
            if pos > stream:
                merged[name] = pos
        return MultiWriterStreamToken(stream, merged)

    def bound_stream_token(self, max_stream: int) -> MultiWriterStreamToken:
        """This token with every position clamped to `max_stream` (e.g. the max allocated ID)."""
        if self.get_max_stream_pos() <= max_stream:
            return self
        stream = min(self._stream, max_stream)
        return MultiWriterStreamToken.from_positions(
            stream, {n: min(p, max_stream) for n, p in self._map.items()}
        )

    def to_string(self, instance_ids: Mapping[str, int]) -> str:
        """`s<N>` or `m<N>~<id>.<pos>...`; raises UnknownInstanceError if a writer has no id in the map."""
        if not self._map:
            return f"s{self._stream}"
        try:
            entries = sorted((instance_ids[name], pos) for name, pos in self._map.items())
        except KeyError as e:
            raise UnknownInstanceError(
                f"instance {e.args[0]!r} has no id in the instance map; assign one (InstanceMap.get_id) first"
            ) from None
        return f"m{self._stream}" + "".join(f"~{i}.{p}" for i, p in entries)

    @staticmethod
    def parse_ids(text: str) -> tuple[int, dict[int, int]]:
        """The structure of a token's text: (stream, {instance id: position}); raises InvalidTokenError."""
        if text.startswith("s"):
            if not _S_FORM.fullmatch(text):
                raise InvalidTokenError(f"invalid stream token {text!r}: expected s<N>")
            return _check_pos(int(text[1:]), text), {}
        head, *parts = text.split("~")
        if not _M_HEAD.fullmatch(head) or not parts:
            raise InvalidTokenError(f"invalid stream token {text!r}: expected s<N> or m<N>~<id>.<pos>...")
        stream = _check_pos(int(head[1:]), text)
        entries: dict[int, int] = {}
        for part in parts:
            if not _M_ENTRY.fullmatch(part):
                raise InvalidTokenError(
                    f"invalid stream token {text!r}: bad entry {part!r}, expected <id>.<pos>"
                )
            ident, pos = (int(x) for x in part.split("."))
            if ident in entries:
                raise InvalidTokenError(f"invalid stream token {text!r}: instance id {ident} appears twice")
            if _check_pos(pos, text) <= stream:
                raise InvalidTokenError(
                    f"invalid stream token {text!r}: entry {part!r} is not ahead of {stream}"
                )
            entries[ident] = pos
        return stream, entries

    @classmethod
    def parse(cls, text: str, instance_names: Mapping[int, str]) -> MultiWriterStreamToken:
        """Parse `to_string` output; raises InvalidTokenError (also for an instance id not in the map)."""
        stream, entries = cls.parse_ids(text)
        try:
            return cls(stream, {instance_names[i]: p for i, p in entries.items()})
        except KeyError as e:
            raise InvalidTokenError(
                f"invalid stream token {text!r}: unknown instance id {e.args[0]}"
            ) from None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiWriterStreamToken):
            return NotImplemented
        return self._stream == other._stream and self._map == other._map

    def __hash__(self) -> int:
        return hash((self._stream, frozenset(self._map.items())))

    def __repr__(self) -> str:
        return f"MultiWriterStreamToken({self._stream}, {self._map!r})"


def _check_pos(value: int, text: str) -> int:
    if value > _MAX_POS:
        raise InvalidTokenError(f"invalid stream token {text!r}: {value} does not fit in 64 bits")
    return value


class SyncToken:
    """One `MultiWriterStreamToken` per stream; immutable. Streams absent from the map are at `s0`."""

    __slots__ = ("_tokens",)

    def __init__(self, tokens: Mapping[str, MultiWriterStreamToken]) -> None:
        self._tokens = dict(tokens)

    def get(self, stream: str) -> MultiWriterStreamToken:
        return self._tokens.get(stream, _ZERO)

    def streams(self) -> Iterator[str]:
        return iter(self._tokens)

    def copy_and_advance(self, stream: str, token: MultiWriterStreamToken) -> SyncToken:
        """This token with `stream`'s component advanced (component-wise max) by `token`."""
        tokens = dict(self._tokens)
        tokens[stream] = self.get(stream).copy_and_advance(token)
        return SyncToken(tokens)

    def merge(self, other: SyncToken) -> SyncToken:
        """Every component advanced by `other`'s: commutative, associative, idempotent. `self`
        itself when it already covers `other` (at /sync the current token covers most `since`
        tokens: the answers of one wake then hold one token object, encoded once)."""
        mine = self._tokens
        merged = {n: self.get(n).copy_and_advance(other.get(n)) for n in mine.keys() | other._tokens.keys()}
        if len(merged) == len(mine) and all(merged[n] is t for n, t in mine.items()):
            return self
        return SyncToken(merged)

    def is_before_or_eq(self, other: SyncToken) -> bool:
        names = self._tokens.keys() | other._tokens.keys()
        return all(self.get(n).is_before_or_eq(other.get(n)) for n in names)

    def bound(self, max_positions: Mapping[str, int]) -> SyncToken:
        """Clamp each listed stream's component to its max (e.g. the max allocated ID)."""
        return SyncToken(
            {
                n: t.bound_stream_token(max_positions[n]) if n in max_positions else t
                for n, t in self._tokens.items()
            }
        )

    def to_string(self, stream_order: Sequence[str], instance_ids: Mapping[str, int]) -> str:
        """Components in `stream_order`, joined by `_`. Raises ValueError for a stream not in the order."""
        unknown = set(self._tokens) - set(stream_order)
        if unknown:
            raise ValueError(
                f"streams {sorted(unknown)} are not in the token's stream order {list(stream_order)}"
            )
        return "_".join(self.get(n).to_string(instance_ids) for n in stream_order)

    @staticmethod
    def parse_ids(text: str, stream_order: Sequence[str]) -> dict[str, tuple[int, dict[int, int]]]:
        """The structure of each component of `stream_order`, keyed by stream (missing ones at
        `s0`, those beyond the order checked and left out); raises InvalidTokenError."""
        parts = text.split("_")
        most = len(stream_order) + MAX_NEWER_COMPONENTS
        if not text or len(parts) > most:
            raise InvalidTokenError(
                f"invalid sync token {text!r}: expected 1 to {most} '_'-separated components"
            )
        for newer in parts[len(stream_order) :]:
            MultiWriterStreamToken.parse_ids(newer)
        parts = parts[: len(stream_order)] + ["s0"] * (len(stream_order) - len(parts))
        return {n: MultiWriterStreamToken.parse_ids(p) for n, p in zip(stream_order, parts, strict=True)}

    @classmethod
    def parse(cls, text: str, stream_order: Sequence[str], instance_names: Mapping[int, str]) -> SyncToken:
        structure = cls.parse_ids(text, stream_order)
        tokens: dict[str, MultiWriterStreamToken] = {}
        for name, (stream, entries) in structure.items():
            try:
                tokens[name] = MultiWriterStreamToken(
                    stream, {instance_names[i]: p for i, p in entries.items()}
                )
            except KeyError as e:
                raise InvalidTokenError(
                    f"invalid sync token {text!r}: unknown instance id {e.args[0]}"
                ) from None
        return cls(tokens)

    @classmethod
    def start(cls, streams: Iterable[str]) -> SyncToken:
        return cls(dict.fromkeys(streams, _ZERO))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SyncToken):
            return NotImplemented
        names = self._tokens.keys() | other._tokens.keys()
        return all(self.get(n) == other.get(n) for n in names)

    def __hash__(self) -> int:
        return hash(frozenset((n, t) for n, t in self._tokens.items() if t != _ZERO))

    def __repr__(self) -> str:
        return f"SyncToken({self._tokens!r})"


_ZERO = MultiWriterStreamToken(0)
