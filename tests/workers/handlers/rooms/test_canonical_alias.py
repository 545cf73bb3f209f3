"""Which aliases a canonical alias event adds (the stored check runs in
tests/workers/http/test_canonical_alias.py)."""

from __future__ import annotations

from typing import Any

import pytest

from workers.handlers.rooms.canonical_alias import added_aliases
from workers.handlers.rooms.rules import InvalidParam


@pytest.mark.parametrize(
    ("content", "current", "added"),
    [
        ({"alias": "#a:hs"}, None, ["#a:hs"]),
        ({"alias": "#a:hs"}, {"alias": "#a:hs"}, []),  # unchanged: not checked again
        ({}, {"alias": "#a:hs", "alt_aliases": ["#b:hs"]}, []),  # dropping is never checked
        ({"alias": "#a:hs", "alt_aliases": ["#a:hs", "#b:hs", "#c:hs"]}, {"alt_aliases": ["#b:hs"]},
         ["#a:hs", "#c:hs"]),
        ({"alt_aliases": ["#b:hs"]}, {"alt_aliases": "junk"}, ["#b:hs"]),  # junk: none
        ({"alias": ""}, None, []),
    ],
)  # fmt: skip
def test_the_aliases_an_event_adds(
    content: dict[str, Any], current: dict[str, Any] | None, added: list[str]
) -> None:
    assert added_aliases(content, current) == added


@pytest.mark.parametrize("content", [{"alias": 7}, {"alt_aliases": "#a:hs"}, {"alt_aliases": ["#a:hs", 7]}])
def test_values_of_the_wrong_type_are_refused(content: dict[str, Any]) -> None:
    with pytest.raises(InvalidParam):  # 400 M_INVALID_PARAM, as Synapse answers
        added_aliases(content, None)
