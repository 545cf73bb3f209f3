"""The hand-written answer bodies against what aiohttp's `json_response` writes for the same value."""

from __future__ import annotations

import pytest
from aiohttp import web

from workers.http.bodies import event_id_response


@pytest.mark.parametrize("event_id", ["$abc", "$" + "0f" * 16, '$q"uote\\back', "$é\u2028\x01"])
def test_event_id_response_is_json_responses(event_id: str) -> None:
    ours, theirs = event_id_response(event_id), web.json_response({"event_id": event_id})
    assert ours.body == theirs.body
    assert dict(ours.headers) == dict(theirs.headers)
    assert ours.status == theirs.status == 200
