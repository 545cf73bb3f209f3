"""RDATA payloads: rows are NamedTuples on the wire as JSON arrays, validated strictly by readers."""

from __future__ import annotations

from typing import Annotated, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError

from pubsub.errors import StreamConfigError
from pubsub.streams import Stream
from tests.pubsub.fakes import MemoryGenerator, MemoryTable


class Sample(NamedTuple):
    name: Annotated[str, Field(min_length=1, max_length=20)]
    keys: Annotated[tuple[str, ...] | None, Field(max_length=3)]
    count: Annotated[int, Field(ge=0)]


def _stream() -> Stream[Sample]:
    return Stream("s", Sample, MemoryTable().update, MemoryGenerator(["w"]), ["w"])


@given(
    name=st.text(min_size=1, max_size=20),
    keys=st.none() | st.lists(st.text(max_size=10), max_size=3).map(tuple),
    count=st.integers(min_value=0, max_value=2**62),
    prev=st.integers(min_value=0, max_value=2**62),
    n=st.integers(min_value=1, max_value=1000),
)
def test_rows_round_trip(name: str, keys: tuple[str, ...] | None, count: int, prev: int, n: int) -> None:
    stream, row = _stream(), Sample(name, keys, count)
    assert stream.parse_payload(Stream.encode_payload(row, prev, n), True) == (row, prev, n)
    assert stream.parse_payload(Stream.encode_payload(row), False) == (row, -1, 0)
    parsed = stream.parse_payload(Stream.encode_payload(row), False)[0]
    assert type(parsed) is Sample and parsed.keys == keys


def test_the_shape_on_the_wire() -> None:
    row = Sample("a", ("k",), 3)
    assert Stream.encode_payload(row, 40, 2) == '[40,2,"a",["k"],3]'
    assert Stream.encode_payload(row) == '["a",["k"],3]'
    assert Stream.encode_payload('["a",null,3]', 7, 1) == '[7,1,"a",null,3]'


@pytest.mark.parametrize(
    "payload",
    [
        '[0,1,"a",null,"3"]',  # no coercion of a numeric string
        '[0,1,"a",null,true]',  # nor of a boolean
        '[0,1,"a",null,3.0]',
        '[0,1,"a",null,-1]',  # the row's own limits
        '[0,1,"",null,3]',
        '[0,1,"a",["1","2","3","4"],3]',
        '[0,0,"a",null,3]',  # a numbered row counts at least itself
        '[-1,1,"a",null,3]',
        '[0,1,"a",null]',  # a missing field without a default
        "[0,1]",
        '{"prev":0,"n":1,"row":{"name":"a","keys":null,"count":3}}',  # objects are not rows
        '[0,1,"a",null,3',
    ],
)
def test_invalid_payloads_are_refused(payload: str) -> None:
    with pytest.raises(ValidationError):
        _stream().parse_payload(payload, True)


class Grown(NamedTuple):
    """`Sample` after a release added a field with a default at its end."""

    name: Annotated[str, Field(min_length=1, max_length=20)]
    keys: Annotated[tuple[str, ...] | None, Field(max_length=3)]
    count: Annotated[int, Field(ge=0)]
    kind: Annotated[str | None, Field(max_length=5)] = None


def test_rows_differ_across_one_release_only_at_their_end() -> None:
    """A reader ignores trailing elements it does not know and defaults trailing fields it knows
    but the row lacks; the fields it knows keep every check."""
    old, new = _stream(), Stream("s", Grown, MemoryTable().update, MemoryGenerator(["w"]), ["w"])
    newer_row = '[4,1,"a",null,3,"m.x",[1,{"k":2}]]'
    assert old.parse_payload(newer_row, True) == (Sample("a", None, 3), 4, 1)
    assert new.parse_payload(newer_row, True) == (Grown("a", None, 3, "m.x"), 4, 1)
    assert new.parse_payload('[4,1,"a",null,3]', True) == (Grown("a", None, 3, None), 4, 1)
    assert new.parse_payload('["a",null,3]', False) == (Grown("a", None, 3, None), -1, 0)
    assert old.parse_payload('["a",null,3,"m.x",9]', False)[0] == Sample("a", None, 3)
    for refused in ('[4,1,"a",null,3,"toolong"]', '[4,1,"a",null,3,7]'):
        with pytest.raises(ValidationError):
            new.parse_payload(refused, True)


def test_the_row_type_must_be_a_named_tuple() -> None:
    class Model(BaseModel):
        name: str

    with pytest.raises(StreamConfigError, match="NamedTuple"):
        Stream("s", Model, MemoryTable().update, MemoryGenerator(["w"]), ["w"])  # type: ignore[type-var]
