"""The wire protocol: one command per pub/sub message, a text line `NAME args`.

Grammar (the one operators know from Synapse's replication commands):

    REPLICATE
    POSITION <stream> <instance> <prev_token> <new_token>
    RDATA <stream> <instance> <token|batch> <row_json>
    USER_SYNC <instance_id> <user_id> <device_id|None> <start|end> <last_sync_ms>
    CLEAR_USER_SYNC <instance_id>

Tokens are canonical non-negative decimal integers (no sign, no leading zeros, at most 2**63 - 1);
for a negative stream the wire token is the negation of the database ID. Stream, instance and
instance-id names use letters, digits, `_`, `.`, `-`. A row is JSON text: `parse_line` keeps it
as text, the stream validates it later against its row type (that is cheaper than validating whole lines).

Across releases (a rolling upgrade runs two) the grammar stays: rows may grow at their end
(`pubsub.streams`) and streams may be added (a reader skips a stream it does not know), but a new
command is refused by the previous release's readers (`unknown_command`): ship the reader that
takes it one release before the first writer that sends it.

`parse_line` and `format_command` are pure and inverse: `parse_line(format_command(c)) == c`
for every valid command. Any invalid input raises `WireError` whose `reason` is a metric label.

Fast paths. Most lines are a writer's numbered RDATA, and both sides handle them by the thousand
per second, so three specialisations of the general functions live here too, under the same rules
(a parametrised test runs the same lines through both): `own_line_prefixes` (the bytes a process's
own lines start with, to drop its echoes unparsed), `split_numbered_rdata` (the checks
`parse_line` makes on a numbered RDATA, on the bytes, with no decoding) and `format_numbered_rdata`
(the line of a single-row token whose row is JSON text, without building a command).
Commands are NamedTuples: immutable like frozen dataclasses, at a third of their construction
cost (one is built per line on both sides of the hot path).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal, NamedTuple

from pubsub.errors import WireError

DEFAULT_MAX_LINE_BYTES = 1 << 20
MAX_TOKEN_DIGITS = 19
#: Tokens are database IDs: PostgreSQL bigints, so at most 2**63 - 1 (19 digits hold more).
MAX_TOKEN = (1 << 63) - 1
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
_USER = re.compile(r"[\x21-\x7e]{1,255}")


class Replicate(NamedTuple):
    """A subscriber (re)joined; every writer answers with a POSITION per stream it writes."""


class Position(NamedTuple):
    """`instance` moved `stream` from `prev_token` to `new_token`; rows between were sent as RDATA."""

    stream: str
    instance: str
    prev_token: int
    new_token: int


class RData(NamedTuple):
    """One row; `token` None means "batch": more rows with the same token follow."""

    stream: str
    instance: str
    token: int | None
    row_json: str


class UserSync(NamedTuple):
    """A process (`instance_id`, random per start) saw a user start or stop syncing."""

    instance_id: str
    user_id: str
    device_id: str | None
    state: Literal["start", "end"]
    last_sync_ms: int


class ClearUserSync(NamedTuple):
    """A process is shutting down: forget every sync it reported."""

    instance_id: str


Command = Replicate | Position | RData | UserSync | ClearUserSync
_new = tuple.__new__
REPLICATE = Replicate()


#: Names already found valid: a cluster has a handful of streams and instances, and the regex
#: showed in receive-path profiles. Bounded, so forged names cannot grow it.
_VALID_NAMES: set[str] = set()
_VALID_NAMES_MAX = 4096


def _name(value: str, what: str) -> str:
    if value in _VALID_NAMES:
        return value
    if NAME_PATTERN.fullmatch(value) is None:
        raise WireError("bad_name", f"{what} {value[:40]!r} is not a valid name")
    if len(_VALID_NAMES) < _VALID_NAMES_MAX:
        _VALID_NAMES.add(value)
    return value


def _token(value: str) -> int:
    if (
        value.isdecimal()
        and value.isascii()
        and len(value) <= MAX_TOKEN_DIGITS
        and (value[0] != "0" or len(value) == 1)
    ):
        token = int(value)
        if token <= MAX_TOKEN:
            return token
        raise WireError("token_too_large", f"{value} is above 2**63 - 1 (a database ID never is)")
    raise WireError("bad_token", f"{value[:40]!r} is not a canonical non-negative integer")


def _parse_rdata(line: str) -> RData:
    parts = line.split(" ", 4)
    if len(parts) != 5:
        raise WireError("bad_arity", "RDATA needs <stream> <instance> <token|batch> <row_json>")
    _, stream, instance, token_text, row_json = parts
    token = None if token_text == "batch" else _token(token_text)
    if not row_json or row_json[0] not in "[{":
        raise WireError("bad_row", "RDATA row must be a JSON object or array")
    # tuple.__new__: the NamedTuple's own __new__ is a Python function, and this runs per line.
    return _new(RData, (_name(stream, "stream"), _name(instance, "instance"), token, row_json))


def _parse_position(rest: str) -> Position:
    parts = rest.split(" ")
    if len(parts) != 4:
        raise WireError("bad_arity", "POSITION needs <stream> <instance> <prev_token> <new_token>")
    prev, new = _token(parts[2]), _token(parts[3])
    if prev > new:
        raise WireError("position_backwards", f"prev_token {prev} > new_token {new}")
    return Position(_name(parts[0], "stream"), _name(parts[1], "instance"), prev, new)


def _parse_user_sync(rest: str) -> UserSync:
    parts = rest.split(" ")
    if len(parts) != 5:
        raise WireError(
            "bad_arity", "USER_SYNC needs <instance_id> <user_id> <device_id|None> <start|end> <ms>"
        )
    iid, user, device, state, ms = parts
    if _USER.fullmatch(user) is None or _USER.fullmatch(device) is None:
        raise WireError("bad_name", "USER_SYNC user_id/device_id must be printable ASCII without spaces")
    if state == "start":
        return UserSync(
            _name(iid, "instance_id"), user, None if device == "None" else device, "start", _token(ms)
        )
    if state == "end":
        return UserSync(
            _name(iid, "instance_id"), user, None if device == "None" else device, "end", _token(ms)
        )
    raise WireError("bad_state", f"USER_SYNC state {state[:20]!r} is not start or end")


def parse_line(data: bytes | str, max_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Command:
    """Decode one pub/sub message into a command, or raise `WireError` (never anything else)."""
    if isinstance(data, bytes):
        if len(data) > max_bytes:
            raise WireError("too_long", f"{len(data)} bytes > limit {max_bytes}")
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError:
            raise WireError("not_utf8", "line is not valid UTF-8") from None
    else:
        line = data
        if len(line) > max_bytes and len(line.encode("utf-8", "surrogatepass")) > max_bytes:
            raise WireError("too_long", f"line longer than limit {max_bytes}")
    if "\n" in line or "\r" in line:
        raise WireError("newline", "a command is exactly one line")
    if line[:6] == "RDATA " or line == "RDATA":  # not startswith: its argument parsing costs more
        return _parse_rdata(line)
    name, sep, rest = line.partition(" ")
    if name == "POSITION":
        return _parse_position(rest)
    if name == "REPLICATE":
        if rest:
            raise WireError("bad_arity", "REPLICATE takes no arguments")
        return REPLICATE
    if name == "USER_SYNC":
        return _parse_user_sync(rest)
    if name == "CLEAR_USER_SYNC":
        if not sep:
            raise WireError("bad_arity", "CLEAR_USER_SYNC needs <instance_id>")
        return ClearUserSync(_name(rest, "instance_id"))
    if not name:
        raise WireError("empty", "empty line or leading space")
    raise WireError("unknown_command", f"unknown command {name[:40]!r}")


def format_rdata(stream: str, instance: str, token: int | None, row_json: str) -> str:
    """`format_command(RData(...))` without building the command (the writer's hot path)."""
    if "\n" in row_json or "\r" in row_json:
        raise WireError("newline", "row JSON must be one line")
    return f"RDATA {stream} {instance} {'batch' if token is None else token} {row_json}"


def format_command(cmd: Command) -> str:
    """Encode a command as its line. Raises `WireError` if the row JSON spans several lines."""
    if isinstance(cmd, RData):
        return format_rdata(*cmd)
    if isinstance(cmd, Position):
        return f"POSITION {cmd.stream} {cmd.instance} {cmd.prev_token} {cmd.new_token}"
    if isinstance(cmd, Replicate):
        return "REPLICATE"
    if isinstance(cmd, UserSync):
        device = "None" if cmd.device_id is None else cmd.device_id
        return f"USER_SYNC {cmd.instance_id} {cmd.user_id} {device} {cmd.state} {cmd.last_sync_ms}"
    return f"CLEAR_USER_SYNC {cmd.instance_id}"


_NAMES: dict[type, str] = {
    Replicate: "REPLICATE",
    Position: "POSITION",
    RData: "RDATA",
    UserSync: "USER_SYNC",
    ClearUserSync: "CLEAR_USER_SYNC",
}


def command_name(cmd: Command) -> str:
    """The command's name on the wire (also its metric label)."""
    return _NAMES[type(cmd)]


def command_stream(cmd: Command) -> str:
    """The stream a command belongs to, or "" for cluster-wide commands (metric label)."""
    if isinstance(cmd, RData | Position):
        return cmd.stream
    return ""


# -- fast paths: the same rules as above, for the commonest lines ----------------------------------


def own_line_prefixes(instance: str, streams: Iterable[str]) -> tuple[bytes, ...]:
    """The byte prefixes of `instance`'s RDATA and POSITION lines on `streams` (for
    `bytes.startswith`): a line starting with one is `instance`'s own, whatever follows."""
    return tuple(
        f"{command} {stream} {instance} ".encode()
        for stream in sorted(streams)
        for command in ("RDATA", "POSITION")
    )


def split_numbered_rdata(data: bytes, max_bytes: int) -> tuple[bytes, bytes, bytes, bytes] | None:
    """`(stream, instance, token, row_json)` of a numbered RDATA line that `parse_line` accepts
    with exactly these fields (names still to be looked up by the caller, which knows its valid
    ones); None for any other line, valid or not: then `parse_line` decides, and names the reason.

    ASCII only (so UTF-8 without decoding); other lines are rare and take the general path."""
    parts = data.split(b" ", 4)
    if len(parts) != 5 or parts[0] != b"RDATA":
        return None
    token, payload = parts[3], parts[4]
    if (
        len(data) <= max_bytes
        and token.isdigit()
        and (token[0] != 48 or len(token) == 1)  # 48: "0"
        and (len(token) < MAX_TOKEN_DIGITS or (len(token) == MAX_TOKEN_DIGITS and int(token) <= MAX_TOKEN))
        and payload[:1] == b"["
        and 10 not in data  # "\n"; an int: `b"\n" in` costs bytes a caught TypeError
        and 13 not in data  # "\r"
        and data.isascii()
    ):
        return parts[1], parts[2], token, payload
    return None


def format_numbered_rdata(stream: str, instance: str, token: int, prev: int, row_json: str) -> str | None:
    """The line `format_rdata(stream, instance, token, Stream.encode_payload(row_json, prev, 1))`
    makes for a single-row token whose row is JSON array text, built in one step; None when the
    text needs the general path (empty array, or a line break to refuse)."""
    if len(row_json) > 2 and "\n" not in row_json and "\r" not in row_json:
        return f"RDATA {stream} {instance} {token} [{prev},1,{row_json[1:]}"
    return None
