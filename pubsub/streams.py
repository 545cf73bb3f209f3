"""`Stream`: one replicated stream, the same object on writers and readers.

A stream has a name, a row type, an update function that reads its rows back from the
database, the ID generator behind it and the list of instances allowed to write it.

Tokens: everything in `pubsub` uses *wire tokens*, positive and increasing. For a negative
stream (`positive=False`, e.g. backfill) the wire token is the negation of the database ID;
`current_token` and `advance` convert at the generator boundary, and the update function
receives and returns wire tokens too.

Rows are NamedTuples whose field annotations carry the limits (`Annotated[str, Field(...)]`) and
travel as positional JSON arrays, as Synapse's stream rows do. Readers check every row with one
strict pydantic tuple validator and build the NamedTuple from the checked values. Validating JSON
objects into pydantic models cost about 2.5 times as much per row (each model instance allocates a
dict and a set, keys are matched one by one); with arrays, a persister applying another's events
takes 29% fewer instructions per event (`fanout bench instructions`).

Compatibility across one release (a rolling upgrade runs both): a row changes only by adding fields
at its end. A reader ignores trailing elements it does not know (any JSON: they are the next
release's fields), and a trailing field it knows but the row lacks takes the NamedTuple's default
when it has one (the previous release's row). A new field without a default is a new stream (a new
name), written beside the old one for a release. A row is always an array: an object is refused.

Dependencies between writers (`dependency_field`): a row may name `(writer, token)` pairs of other
writers of the same stream whose rows up to the token must be applied before it (a key that moved
from one writer to another: the new writer's rows of that key come after every row the old one
wrote for it). The field holds a sequence of such pairs, or None; `StreamQueue` applies the other
writer's rows up to the token, from the database, before the row. Whoever writes a pair guarantees
that every row of that writer at or below the token is final (committed or never to be), so that
position is true.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from types import GenericAlias
from typing import Annotated, Any, Generic, TypeVar, get_type_hints

import pydantic_core
from pydantic import ConfigDict, Field, TypeAdapter
from pydantic_core import SchemaValidator, core_schema

from pubsub.errors import StreamConfigError
from pubsub.types import IdGenerator, Row, UpdateFunction, Witness
from pubsub.wire import NAME_PATTERN

RowT = TypeVar("RowT", bound=tuple[Any, ...])
_STRICT = ConfigDict(strict=True)


class Stream(Generic[RowT]):
    """A replicated stream.

    Contract: `update_function(instance, from_token, to_token, limit)` returns at most `limit`
    `(token, row)` pairs of `instance` with `from_token < token <= to_token`, sorted by token.
    Rows may share a token. A writer's `current_token(self)` only covers finished IDs, so it
    always points to rows the update function can serve.
    """

    __slots__ = (
        "_batched",
        "_numbered",
        "dependency_index",
        "generator",
        "name",
        "positive",
        "row_type",
        "update_function",
        "width",
        "witness",
        "writers",
    )

    def __init__(
        self,
        name: str,
        row_type: type[RowT],
        update_function: UpdateFunction,
        generator: IdGenerator,
        writers: Iterable[str],
        *,
        positive: bool = True,
        dependency_field: str | None = None,
    ) -> None:
        if NAME_PATTERN.fullmatch(name) is None:
            raise StreamConfigError(f"stream name {name!r}: use letters, digits, '_', '.', '-'")
        fields = getattr(row_type, "_fields", None)
        if not isinstance(fields, tuple) or not issubclass(row_type, tuple):
            raise StreamConfigError(f"stream {name!r}: the row type must be a NamedTuple")
        self.name = name
        self.row_type = row_type
        self.update_function = update_function
        self.generator = generator
        self.writers = frozenset(writers)
        self.positive = positive
        #: How many fields a row has: validated values beyond them are a later release's, ignored.
        self.width = len(fields)
        if dependency_field is not None and dependency_field not in fields:
            raise StreamConfigError(f"stream {name!r}: no row field {dependency_field!r} to depend on")
        #: The row field naming the `(writer, token)` a row depends on (see the module docstring).
        self.dependency_index = None if dependency_field is None else fields.index(dependency_field)
        #: Set by a reader that reads a stream's rows from the database anyway (the events' bodies,
        #: for its long-polls): a row found stored at its token proves that token within the
        #: sequence, in the same read, so the reader's queue skips the sequence read for it
        #: (`StreamQueue`, "the bound"). None: the sequence decides alone.
        self.witness: Witness | None = None
        hints = get_type_hints(row_type, include_extras=True)
        field_types = tuple(hints[f] for f in fields)
        field_defaults: dict[str, object] = getattr(row_type, "_field_defaults", {})
        defaults = tuple(field_defaults.get(f, _REQUIRED) for f in fields)
        envelope = (Annotated[int, Field(ge=0)], Annotated[int, Field(ge=1)])
        self._numbered = _row_validator((*envelope, *field_types), (_REQUIRED, _REQUIRED, *defaults))
        self._batched = _row_validator(field_types, defaults)

    def current_token(self, instance: str) -> int:
        """What this process knows of `instance`'s position, as a wire token."""
        value = self.generator.get_current_token_for_writer(instance)
        return value if self.positive else -value

    def advance(self, instance: str, token: int) -> None:
        """Tell the generator `instance` reached wire `token` (monotone: never moves back)."""
        self.generator.advance(instance, token if self.positive else -token)

    @property
    def bounded(self) -> bool:
        """Whether a sequence bounds this stream's tokens (`max_token` can read one)."""
        return getattr(self.generator, "get_max_allocated_token", None) is not None

    async def max_token(self) -> int | None:
        """The highest wire token any writer of this stream can have reached: the sequence's last
        value (every ID ever handed out, in flight included). None when the generator cannot say
        (one held in memory): then nothing bounds a token."""
        read = getattr(self.generator, "get_max_allocated_token", None)
        if read is None:
            return None
        value = int(await read())
        return value if self.positive else -value

    def known_bound(self) -> int:
        """A wire token every writer of this stream is known to have been handed, without I/O (the
        generator's own allocations and sequence reads; 0 when it cannot say): a lower bound of
        `max_token`."""
        known = getattr(self.generator, "known_allocated_token", None)
        if known is None:
            return 0
        value = int(known())
        return value if self.positive else -value

    def dependencies(self, writer: str, rows: Sequence[tuple[int, Any]]) -> dict[str, int]:
        """The other writers `rows` of `writer` depend on, each with the highest token named; empty
        when the stream has no dependency field or no row names one (the usual case: one pass)."""
        index = self.dependency_index
        if index is None:
            return {}
        named = [row[index] for _, row in rows if row[index] is not None]
        needed: dict[str, int] = {}
        for pairs in named:
            for other, token in pairs:
                if other != writer and token > needed.get(other, 0):
                    needed[other] = token
        return needed

    def positions(self) -> dict[str, int]:
        """Every writer's known position as wire tokens (the stream's vector clock here)."""
        factor = 1 if self.positive else -1
        return {name: factor * value for name, value in self.generator.get_positions().items()}

    @property
    def validate_numbered(self) -> Callable[[str | bytes], tuple[Any, ...]]:
        """The strict check of a numbered payload that `parse_payload` makes: it returns the
        values `(prev, n, *fields, *unknown)` or raises pydantic.ValidationError. For the receive
        path, which builds the row itself (`tuple.__new__(row_type, values[2 : 2 + width])`) rather
        than pay a call per row."""
        validate: Callable[[str | bytes], tuple[Any, ...]] = self._numbered.validate_json
        return validate

    def parse_payload(self, payload: str | bytes, numbered: bool) -> tuple[RowT, int, int]:
        """Validate an RDATA payload: `(row, prev, n)`; a batch row has prev=-1, n=0.

        Raises pydantic.ValidationError. See `encode_payload` for the shape.
        """
        if numbered:
            values = self.validate_numbered(payload)
            return tuple.__new__(self.row_type, values[2 : 2 + self.width]), values[0], values[1]
        return tuple.__new__(self.row_type, self._batched.validate_json(payload)[: self.width]), -1, 0

    @staticmethod
    def encode_payload(row: tuple[Any, ...] | str, prev: int | None = None, n: int = 0) -> str:
        """The RDATA JSON: the row's fields as an array, `["a", 1]`, on batch rows; the numbered row
        of a token starts with the writer's previous announced token and the number of rows of the
        token: `[40, 3, "a", 1]`. Readers use them to see a lost RDATA at once (Redis pub/sub may
        lose any message) instead of applying later rows past a hole.

        `row` is a row, or its JSON array text when the writer builds it directly (readers validate
        either way). A last field that is None and defaults to None (an optional trailing field such
        as a dependency) is left out: readers take its default, and most rows are a field shorter."""
        if not isinstance(row, str) and row and row[-1] is None:
            fields: tuple[str, ...] = getattr(type(row), "_fields", ())
            if fields and getattr(type(row), "_field_defaults", {}).get(fields[-1], _REQUIRED) is None:
                row = tuple(row[:-1])
        body = row if isinstance(row, str) else pydantic_core.to_json(row).decode()
        if prev is None:
            return body
        return f"[{prev},{n},{body[1:]}" if len(body) > 2 else f"[{prev},{n}]"

    async def fetch_updates(
        self, instance: str, from_token: int, to_token: int, limit: int
    ) -> list[tuple[int, Any]]:
        """Call the update function and check its contract (range and order)."""
        rows = list(await self.update_function(instance, from_token, to_token, limit))
        last = from_token
        for token, _row in rows:
            if token < last or token <= from_token or token > to_token:
                raise StreamConfigError(
                    f"update function of {self.name} returned token {token} outside ({from_token}, "
                    f"{to_token}] or out of order"
                )
            last = token
        if len(rows) > limit:
            raise StreamConfigError(
                f"update function of {self.name} returned {len(rows)} > limit {limit} rows"
            )
        return rows

    def __repr__(self) -> str:
        return f"Stream({self.name!r}, writers={sorted(self.writers)}, positive={self.positive})"


_REQUIRED = object()


def _row_validator(types: Sequence[Any], defaults: Sequence[object]) -> SchemaValidator:
    """Strict (a forged row gets no coercion: no "5" for 5; JSON arrays still validate as tuples)
    validation of an array of `types`, then any trailing elements, unchecked and returned; an
    element missing from the end takes its default where `defaults` has one (`_REQUIRED`: none)."""
    row: Any = GenericAlias(tuple, tuple(types))
    schema: Any = TypeAdapter(row, config=_STRICT).core_schema
    if schema["type"] != "tuple":
        raise StreamConfigError(f"row fields {types} need shared definitions: not supported")
    items = [
        item if default is _REQUIRED else core_schema.with_default_schema(item, default=default)
        for item, default in zip(schema["items_schema"], defaults, strict=True)
    ]
    items.append(core_schema.any_schema())
    tuple_schema = core_schema.tuple_schema(items, variadic_item_index=len(items) - 1)
    return SchemaValidator(tuple_schema, core_schema.CoreConfig(strict=True))


class StreamRegistry:
    """The streams a process knows, by name. Names are unique."""

    def __init__(self, streams: Sequence[Stream[Any]] = ()) -> None:
        self._streams: dict[str, Stream[Any]] = {}
        for stream in streams:
            self.add(stream)

    def add(self, stream: Stream[Any]) -> None:
        if stream.name in self._streams:
            raise StreamConfigError(f"stream {stream.name!r} registered twice")
        self._streams[stream.name] = stream

    def get(self, name: str) -> Stream[Any] | None:
        return self._streams.get(name)

    def __getitem__(self, name: str) -> Stream[Any]:
        try:
            return self._streams[name]
        except KeyError:
            raise StreamConfigError(f"unknown stream {name!r}; register it first") from None

    def __iter__(self) -> Iterator[Stream[Any]]:
        return iter(self._streams.values())

    def __len__(self) -> int:
        return len(self._streams)

    def written_by(self, instance: str) -> list[Stream[Any]]:
        return [s for s in self._streams.values() if instance in s.writers]


#: (stream, instance, token, rows) -> None; runs before the generator is advanced to `token`. `rows`
#: are (token, row) pairs in stream order, all at or below `token`: one call may carry several
#: tokens' rows (a run of single-row tokens is applied at once), so a row's own position is its pair's.
ApplyCallback = Callable[[Stream[Any], str, int, Sequence[tuple[int, Row]]], Awaitable[None]]
