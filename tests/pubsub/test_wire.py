"""Wire protocol: every command round-trips; malformed lines are rejected with a reason."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsub.errors import WireError
from pubsub.wire import (
    REPLICATE,
    ClearUserSync,
    Command,
    Position,
    RData,
    UserSync,
    format_command,
    parse_line,
)

names = st.from_regex(r"[A-Za-z0-9_.\-]{1,30}", fullmatch=True)
tokens = st.integers(min_value=0, max_value=10**19 - 1)
printable = st.from_regex(r"[\x21-\x7e]{1,40}", fullmatch=True)
json_rows = st.dictionaries(
    st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=20), st.none(), st.booleans()), max_size=5
).map(lambda d: __import__("json").dumps(d, ensure_ascii=False))


@st.composite
def positions(draw: st.DrawFn) -> Position:
    prev = draw(tokens)
    new = draw(st.integers(min_value=prev, max_value=10**19 - 1))
    return Position(draw(names), draw(names), prev, new)


commands: st.SearchStrategy[Command] = st.one_of(
    st.just(REPLICATE),
    positions(),
    st.builds(RData, names, names, st.one_of(st.none(), tokens), json_rows),
    st.builds(
        UserSync,
        names,
        printable,
        st.one_of(st.none(), printable.filter(lambda d: d != "None")),
        st.sampled_from(["start", "end"]),
        tokens,
    ),
    st.builds(ClearUserSync, names),
)


@given(commands)
def test_every_command_round_trips(cmd: Command) -> None:
    line = format_command(cmd)
    assert "\n" not in line
    assert parse_line(line) == cmd
    assert parse_line(line.encode()) == cmd


def test_formats_match_the_grammar() -> None:
    assert format_command(REPLICATE) == "REPLICATE"
    assert format_command(Position("events", "w1", 3, 7)) == "POSITION events w1 3 7"
    assert format_command(RData("events", "w1", None, '{"a": 1}')) == 'RDATA events w1 batch {"a": 1}'
    assert format_command(RData("events", "w1", 5, "[1]")) == "RDATA events w1 5 [1]"
    assert (
        format_command(UserSync("abcde", "@u:x", None, "start", 12)) == "USER_SYNC abcde @u:x None start 12"
    )
    assert format_command(ClearUserSync("abcde")) == "CLEAR_USER_SYNC abcde"


def test_json_with_spaces_survives() -> None:
    cmd = parse_line('RDATA s w 9 {"k": "a b  c", "n": [1, 2]}')
    assert isinstance(cmd, RData)
    assert cmd.row_json == '{"k": "a b  c", "n": [1, 2]}'


MALFORMED = [
    (b"", "empty"),
    (b" REPLICATE", "empty"),
    (b"HELLO world", "unknown_command"),
    (b"replicate", "unknown_command"),
    (b"REPLICATE now", "bad_arity"),
    (b"POSITION s w 1", "bad_arity"),
    (b"POSITION s w 1 2 3", "bad_arity"),
    (b"POSITION s w -1 2", "bad_token"),
    (b"POSITION s w 01 2", "bad_token"),
    (b"POSITION s w 1 2.0", "bad_token"),
    (b"POSITION s w 1 99999999999999999999", "bad_token"),
    ("POSITION s w 1 \u0662".encode(), "bad_token"),
    (b"POSITION s w 5 2", "position_backwards"),
    (b"POSITION s/x w 1 2", "bad_name"),
    (b"RDATA s w 1", "bad_arity"),
    (b"RDATA s w 1 notjson", "bad_row"),
    (b"RDATA s w+ 1 {}", "bad_name"),
    (b"RDATA s w BATCH {}", "bad_token"),
    (b"RDATA s w 1 {}\n", "newline"),
    (b"RDATA s w 1 {\r}", "newline"),
    (b"\xff\xfe", "not_utf8"),
    (b"USER_SYNC i u d maybe 5", "bad_state"),
    (b"USER_SYNC i u d start", "bad_arity"),
    (b"CLEAR_USER_SYNC", "bad_arity"),
    (b"CLEAR_USER_SYNC a b", "bad_name"),
]


@pytest.mark.parametrize(("line", "reason"), MALFORMED)
def test_malformed_lines_are_rejected_with_a_reason(line: bytes, reason: str) -> None:
    with pytest.raises(WireError) as info:
        parse_line(line)
    assert info.value.reason == reason


def test_size_limit() -> None:
    line = b"RDATA s w 1 " + b'{"a":"' + b"x" * 2000 + b'"}'
    assert isinstance(parse_line(line, max_bytes=4096), RData)
    with pytest.raises(WireError) as info:
        parse_line(line, max_bytes=1024)
    assert info.value.reason == "too_long"
    with pytest.raises(WireError):
        parse_line(line.decode(), max_bytes=1024)


def test_format_refuses_multiline_rows() -> None:
    with pytest.raises(WireError):
        format_command(RData("s", "w", 1, '{"a":\n1}'))


def test_packed_publish_matches_redis_py() -> None:
    """The transport packs (S)PUBLISH itself; the bytes must be what redis-py would send."""
    from redis.connection import Connection

    from pubsub.redis_transport import pack_publishes

    lines = [
        ("fanout/s", 'RDATA s w1 7 {"row": {"p": "é \\r\\n"}}'),
        ("fanout", "REPLICATE"),
        ("fanout/s", "x"),
    ]
    for command in (b"PUBLISH", b"SPUBLISH"):
        expected = b"".join(
            b"".join(Connection().pack_command(command, channel.encode(), line.encode()))
            for channel, line in lines
        )
        size = sum(len(line.encode()) for _, line in lines)
        assert pack_publishes(command, lines) == (expected, 3, size)
