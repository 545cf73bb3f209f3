"""The form of the content types the server reads: server ACLs, mentions, retention."""

from __future__ import annotations

from typing import Any

import pytest

from workers.handlers.rooms.known_content import acl_admits, problem


@pytest.mark.parametrize(
    ("content", "server", "admitted"),
    [
        ({"allow": ["*"]}, "hs.example", True),
        ({}, "hs.example", False),  # nothing allowed: every server refused
        ({"allow": ["*"], "deny": ["hs.example"]}, "hs.example", False),
        ({"allow": ["*"], "deny": ["HS.Example"]}, "hs.example", False),  # globs ignore case
        ({"allow": ["*"], "deny": ["*.example"]}, "hs.example", False),
        ({"allow": ["*"], "deny": ["*.example"]}, "example", True),
        ({"allow": ["h?.example"]}, "hs.example", True),
        ({"allow": ["h?.example"]}, "hsx.example", False),
        ({"allow": ["hs.example"]}, "hs.example:8448", True),  # the port is not considered
        ({"allow": ["hs.example:8448"]}, "hs.example:8448", False),
        ({"allow": ["hs.exampl."]}, "hs.example", False),  # a dot is a dot, not any character
        ({"allow": ["*"], "allow_ip_literals": False}, "127.0.0.1:8008", False),
        ({"allow": ["*"], "allow_ip_literals": False}, "[::1]:8008", False),
        ({"allow": ["*"], "allow_ip_literals": False}, "hs.example", True),
        ({"allow": ["*"], "allow_ip_literals": "no"}, "127.0.0.1", True),  # not a bool: the default
        ({"allow": ["*"], "deny": "hs.example"}, "hs.example", True),  # not a list: none
        ({"allow": [7, "*"], "deny": [None]}, "hs.example", True),  # not a string: matches nothing
    ],
)
def test_a_server_acl_admits_as_the_spec_says(content: dict[str, Any], server: str, admitted: bool) -> None:
    assert acl_admits(content, server) is admitted


@pytest.mark.parametrize(
    ("event_type", "content", "state_key", "refused"),
    [
        ("m.room.server_acl", {"allow": ["*"], "deny": ["evil.example"]}, "", False),
        ("m.room.server_acl", {"allow": ["*"], "deny": ["localhost"]}, "", True),
        ("m.room.server_acl", {"allow": ["elsewhere.example"]}, "", True),
        ("m.room.message", {"body": "hi", "m.mentions": {}}, None, False),
        ("m.room.message", {"body": "hi", "m.mentions": {"user_ids": ["@a:b"], "room": True}}, None, False),
        ("m.room.message", {"body": "hi", "m.mentions": []}, None, True),
        ("m.room.message", {"body": "hi", "m.mentions": {"user_ids": "@a:b"}}, None, True),
        ("m.room.message", {"body": "hi", "m.mentions": {"user_ids": [1]}}, None, True),
        ("m.room.message", {"body": "hi", "m.mentions": {"room": 1}}, None, True),
        ("m.room.topic", {"topic": "t", "m.mentions": {"room": "yes"}}, "", True),
        ("m.room.retention", {"min_lifetime": 1000, "max_lifetime": 2000}, "", False),
        ("m.room.retention", {"max_lifetime": "2000"}, "", True),
        ("m.room.retention", {"max_lifetime": True}, "", True),
        ("m.room.retention", {"min_lifetime": 3000, "max_lifetime": 2000}, "", True),
        ("m.room.retention", {"max_lifetime": 2000}, None, True),  # a state event only
    ],
)
def test_content_the_server_reads_has_its_form(
    event_type: str, content: dict[str, Any], state_key: str | None, refused: bool
) -> None:
    found = problem(event_type, content, state_key, "@alice:localhost")
    assert (found is not None) is refused, found
