"""Wire protocol: every command round-trips; malformed lines are rejected with a reason."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsub.errors import WireError
from pubsub.streams import Stream
from pubsub.wire import (
    MAX_TOKEN,
    REPLICATE,
    ClearUserSync,
    Command,
    Position,
    RData,
    UserSync,
    format_command,
    format_numbered_rdata,
    format_rdata,
    own_line_prefixes,
    parse_line,
    split_numbered_rdata,
)

names = st.from_regex(r"[A-Za-z0-9_.\-]{1,30}", fullmatch=True)
tokens = st.integers(min_value=0, max_value=MAX_TOKEN)
printable = st.from_regex(r"[\x21-\x7e]{1,40}", fullmatch=True)
json_rows = st.dictionaries(
    st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=20), st.none(), st.booleans()), max_size=5
).map(lambda d: __import__("json").dumps(d, ensure_ascii=False))


@st.composite
def positions(draw: st.DrawFn) -> Position:
    prev = draw(tokens)
    new = draw(st.integers(min_value=prev, max_value=MAX_TOKEN))
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
    (b"POSITION s w 0 9223372036854775808", "token_too_large"),
    (b"RDATA s w 9999999999999999999 [1]", "token_too_large"),
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


# -- the fast paths follow the general grammar ------------------------------------------------------

#: Lines around every rule the fast RDATA split applies, valid and not.
FAST_CASES = [
    *(line for line, _ in MALFORMED),
    b"RDATA s w 1 [0,1,2]",
    b"RDATA s w 0 [0,1]",
    b"RDATA s w 00 [0,1]",
    b"RDATA s w batch [1]",
    b"RDATA s w 1 {}",
    b"RDATA s w 9223372036854775807 [1]",
    b"RDATA s w 9223372036854775808 [1]",
    b'RDATA s w 12 [3,1,"with spaces", "x"]',
    'RDATA s w 12 [3,1,"\u00e9"]'.encode(),
    b"RDATA s w 12 [3,1]\r",
    b"RDATA  s w 12 [3,1]",
    b"POSITION s w 1 2",
    b"RDATA s w 12 [" + b"x" * 200,
]


@pytest.mark.parametrize("line", FAST_CASES)
def test_split_numbered_rdata_agrees_with_parse_line(line: bytes) -> None:
    """Whatever the fast split accepts, the general parser accepts with the same fields; what it
    leaves to the general path is either invalid, not a numbered RDATA, or not ASCII."""
    fields = split_numbered_rdata(line, 100)
    try:
        cmd = parse_line(line, 100)
    except WireError:
        cmd = None
    if fields is not None:
        assert isinstance(cmd, RData) and cmd.token is not None
        assert (cmd.stream.encode(), cmd.instance.encode(), cmd.token, cmd.row_json.encode()) == (
            fields[0], fields[1], int(fields[2]), fields[3],
        )  # fmt: skip
    elif isinstance(cmd, RData) and cmd.token is not None:
        assert not line.isascii() or not cmd.row_json.startswith("[")


@given(st.builds(RData, names, names, tokens, json_rows))
def test_split_numbered_rdata_accepts_every_formatted_ascii_array_row(cmd: RData) -> None:
    line = format_command(cmd._replace(row_json="[" + cmd.row_json + "]")).encode()
    if line.isascii():
        fields = split_numbered_rdata(line, 1 << 20)
        assert fields is not None and int(fields[2]) == cmd.token


@given(names, names, tokens, tokens, st.lists(st.one_of(st.integers(), st.text(max_size=10)), max_size=4))
def test_format_numbered_rdata_is_format_rdata_of_the_encoded_payload(
    stream: str, instance: str, token: int, prev: int, fields: list[object]
) -> None:
    row_json = __import__("json").dumps(fields, separators=(",", ":"))
    line = format_numbered_rdata(stream, instance, token, prev, row_json)
    general = format_rdata(stream, instance, token, Stream.encode_payload(row_json, prev, 1))
    assert line is None if row_json == "[]" else line == general


def test_own_line_prefixes_match_formatted_lines() -> None:
    prefixes = own_line_prefixes("me", ["b", "a"])
    assert format_rdata("a", "me", 3, "[1]").encode().startswith(prefixes)
    assert format_command(Position("b", "me", 1, 2)).encode().startswith(prefixes)
    assert not format_command(Position("b", "meme", 1, 2)).encode().startswith(prefixes)
