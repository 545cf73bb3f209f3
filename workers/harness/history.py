"""The history checker: did every sync reader see every event of its rooms exactly once, in token order?

It knows nothing of the worker's code: it takes what the clients recorded (each /sync's since,
next_batch and events) and the events table at the end, and checks, per user:

* no event delivered twice;
* no gap: every event visible to the user between its first `since` and its last `next_batch`
  was delivered;
* nothing extra: no event the user may not see (another user's room, before joining, backfill);
* tokens never go backwards, every delivered event lies inside its response's window
  (since, next_batch] for the event's writer, and a room's events come in stream order (a Matrix
  sync answer groups events by room, so there is no order across rooms to check), also when a
  client's successive syncs go to different sync workers;
* a timeline that says `limited: true` has a `prev_batch`, and the client filled its gap with
  /messages back to its `since` (`workers.harness.gap_fill`): the events fetched count as delivered
  by that answer, before the room's timeline, under the same rules (once, in order, in the window).

`check_stored_streams` does the same for the stored streams: account data, the user's own device
list changes, and the to-device messages sent to the user's device.

Visibility, defined here independently of the sync handler: an event is visible to a user when
it is the user's own membership event, or the user's membership in the room just after the event
is `join` (replaying the room's member events in stream order), or the user joins the room later
inside the same sync window and the room's history visibility at the event is `shared` or
`world_readable` (or `invited`, and the user was invited at the event). A client receives the
visible events in the timelines of `rooms.join` and `rooms.leave` and, for its own invite or knock,
as the last entry of `invite_state` / `knock_state`; the loads record all three.

Membership windows, as the spec and Synapse place a room, checked when a record lists its rooms'
sections: for each sync's window and room, the user's own last membership event in the window
decides: join -> `join`; leave or ban -> `leave`; invite or knock -> `invite` / `knock`, and also
`leave` when the window holds a leave or ban. An invite or knock superseded in its window by
another one with no leave, ban or join between is not delivered, so it is not expected.

The events table is the truth, so the loads checked here must never purge a room (the Delete Room
API deletes events that clients already got); neither the demo nor chaos does.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from idgen import MultiWriterStreamToken, SyncToken
from workers.handlers.sync.handler import SYNC_STREAMS


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A row of the events table, as the checker needs it."""

    stream_ordering: int
    instance_name: str
    event_id: str
    room_id: str
    type: str
    state_key: str | None
    membership: str | None
    #: content.history_visibility of an m.room.history_visibility event.
    visibility: str | None = None


@dataclass(frozen=True, slots=True)
class SyncRecord:
    """One /sync answer as a client saw it: the events' ids, the global account data types, the
    to-device messages' ids (their `content.msg`) and the users in `device_lists.changed`."""

    worker: str
    since: str
    next_batch: str
    event_ids: tuple[str, ...]
    account_data: tuple[str, ...] = ()
    to_device: tuple[str, ...] = ()
    device_changed: tuple[str, ...] = ()
    #: (section, room id) of every room the answer listed; None: not recorded (not checked).
    sections: tuple[tuple[str, str], ...] | None = None
    #: (room, receipt type, user, event id) of every receipt the answer carried.
    receipts: tuple[tuple[str, str, str, str], ...] = ()
    #: The syncing device's `signed_curve25519` one-time keys left (None: not recorded).
    one_time_keys: int | None = None
    #: (room, whether it came with a `prev_batch`) of every timeline that said `limited: true`.
    limited: tuple[tuple[str, bool], ...] = ()
    #: (room, the events the client fetched with /messages to fill its limited timeline's gap,
    #: oldest first): they belong to this answer's window, before the room's timeline.
    filled: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def delivered(self) -> tuple[str, ...]:
        """Every event the client got from this answer, gap fills first (each room's fill comes
        before its timeline, so a room's events keep their order)."""
        return (*(i for _, ids in self.filled for i in ids), *self.event_ids)


@dataclass(frozen=True, slots=True)
class StoredChange:
    """A row of a stored stream, as the checker needs it: a user's global account data of type
    `key`, or (`key` "") a change of the user's device list."""

    stream: str
    user_id: str
    key: str
    stream_id: int
    instance_name: str


def stream_token(text: str, stream: str = "events") -> MultiWriterStreamToken:
    """A stream's component, keyed by instance id (as text): names are not needed to compare."""
    position, entries = SyncToken.parse_ids(text, SYNC_STREAMS)[stream]
    return MultiWriterStreamToken(position, {str(i): p for i, p in entries.items()})


def events_token(text: str) -> MultiWriterStreamToken:
    return stream_token(text, "events")


def visible_events(
    user_id: str, events: Iterable[StoredEvent], joins_later: Callable[[StoredEvent], bool] | None = None
) -> list[StoredEvent]:
    """The live events `user_id` may see, in stream order. `joins_later(event)`: whether the user
    joins the event's room after it inside the event's sync window (None: never)."""
    membership: dict[str, str] = {}
    rules: dict[str, str] = {}
    visible: list[StoredEvent] = []
    for event in sorted((e for e in events if e.stream_ordering > 0), key=lambda e: e.stream_ordering):
        rule = rules.get(event.room_id, "shared")
        if event.type == "m.room.history_visibility" and event.state_key == "":
            new = event.visibility if event.visibility in _RULES else "joined"
            rules[event.room_id] = new
            rule = min(rule, new, key=_RULES.index)
        own_member_event = event.type == "m.room.member" and event.state_key == user_id
        if own_member_event and event.membership is not None:
            membership[event.room_id] = event.membership
        at = membership.get(event.room_id)
        if own_member_event or at == "join":
            visible.append(event)
        elif (
            joins_later is not None
            and (rule in ("world_readable", "shared") or (rule == "invited" and at == "invite"))
            and joins_later(event)
        ):
            visible.append(event)
    return visible


#: History visibility values, widest first.
_RULES = ("world_readable", "shared", "invited", "joined")


def check_history(
    user_id: str,
    records: Sequence[SyncRecord],
    stored: Sequence[StoredEvent],
    instance_ids: Mapping[str, int],
) -> list[str]:
    """Every violation found for this user, as readable lines (empty: the history is correct)."""
    if not records:
        return []
    problems: list[str] = []
    by_id = {e.event_id: e for e in stored}
    seen: dict[str, int] = {}
    previous: MultiWriterStreamToken | None = None

    def pos(token: MultiWriterStreamToken, event: StoredEvent) -> int:
        return token.get_stream_pos_for_instance(str(instance_ids[event.instance_name]))

    for index, record in enumerate(records):
        since, upto = events_token(record.since), events_token(record.next_batch)
        moved = (
            ""
            if index == 0 or records[index - 1].worker == record.worker
            else (f" (moved from {records[index - 1].worker} to {record.worker})")
        )
        if previous is not None and not previous.is_before_or_eq(since):
            problems.append(
                f"{user_id}: sync {index} started from a token before the previous next_batch{moved}"
            )
        if not since.is_before_or_eq(upto):
            problems.append(
                f"{user_id}: sync {index} went backwards{moved}: {record.since} -> {record.next_batch}"
            )
        previous = upto
        filled = {room for room, _ in record.filled}
        for room_id, has_prev_batch in record.limited:
            if not has_prev_batch:
                problems.append(
                    f"{user_id}: sync {index} says {room_id}'s timeline is limited, no prev_batch"
                )
            elif room_id not in filled:
                problems.append(f"{user_id}: sync {index}'s limited timeline of {room_id}: gap never filled")
        last_ordering: dict[str, int] = {}
        for event_id in record.delivered():
            event = by_id.get(event_id)
            if event is None:
                problems.append(f"{user_id}: sync {index} delivered unknown event {event_id}")
                continue
            if event_id in seen:
                problems.append(f"{user_id}: {event_id} delivered twice (syncs {seen[event_id]}, {index})")
            seen.setdefault(event_id, index)
            if not pos(since, event) < event.stream_ordering <= pos(upto, event):
                window = f"{record.since}..{record.next_batch}"
                problems.append(
                    f"{user_id}: {event_id} ({event.stream_ordering}) outside its window {window}"
                )
            if event.stream_ordering < last_ordering.get(event.room_id, event.stream_ordering):
                problems.append(f"{user_id}: sync {index} events of a room not in stream order at {event_id}")
            last_ordering[event.room_id] = event.stream_ordering
    first, last = events_token(records[0].since), events_token(records[-1].next_batch)
    window_of = _WindowIndex(records, pos)
    windows = _membership_windows(user_id, stored, window_of)
    superseded = {e.event_id for window in windows.values() for e in window.superseded}
    joins: dict[str, list[tuple[int, int]]] = {}  # room -> (ordering, window) of the user's joins
    for event in stored:
        if event.type == "m.room.member" and event.state_key == user_id and event.membership == "join":
            join_window = window_of(event)
            if join_window is not None:
                joins.setdefault(event.room_id, []).append((event.stream_ordering, join_window))

    def joins_later(event: StoredEvent) -> bool:
        later = [i for o, i in joins.get(event.room_id, ()) if o > event.stream_ordering]
        return bool(later) and window_of(event) in later

    expected = {
        e.event_id
        for e in visible_events(user_id, stored, joins_later)
        if pos(first, e) < e.stream_ordering <= pos(last, e) and e.event_id not in superseded
    }
    for event_id in sorted(expected - seen.keys(), key=lambda i: by_id[i].stream_ordering):
        problems.append(f"{user_id}: missed {event_id} (ordering {by_id[event_id].stream_ordering})")
    for event_id in sorted(
        seen.keys() - expected, key=lambda i: by_id[i].stream_ordering if i in by_id else 0
    ):
        if event_id in by_id:
            problems.append(f"{user_id}: got {event_id} which it may not see")
    for (index, room_id), placed in sorted(windows.items()):
        listed = records[index].sections
        if listed is None:
            continue
        for section in sorted(placed.sections - {s for s, r in listed if r == room_id}):
            problems.append(
                f"{user_id}: sync {index} did not list {room_id} under {section}"
                f" (its membership changes in the window: {', '.join(placed.changes)})"
            )
    return problems


@dataclass(slots=True)
class _Window:
    """One room in one sync's window: the user's own membership changes, the sections the room
    must be listed in, and the invites or knocks a later one superseded."""

    changes: list[str]
    sections: set[str]
    superseded: list[StoredEvent]


class _WindowIndex:
    """event -> the index of the sync whose window (since, next_batch] holds it for its writer
    (None: outside every window). The windows tile, so a binary search per writer finds it."""

    def __init__(
        self, records: Sequence[SyncRecord], pos: Callable[[MultiWriterStreamToken, StoredEvent], int]
    ) -> None:
        self._tokens = [(events_token(r.since), events_token(r.next_batch)) for r in records]
        self._pos = pos
        self._uptos: dict[str, list[int]] = {}

    def __call__(self, event: StoredEvent) -> int | None:
        uptos = self._uptos.get(event.instance_name)
        if uptos is None:
            uptos = self._uptos[event.instance_name] = [self._pos(high, event) for _, high in self._tokens]
        index = bisect.bisect_left(uptos, event.stream_ordering)
        if index == len(uptos):
            return None
        low, high = self._tokens[index]
        inside = self._pos(low, event) < event.stream_ordering <= self._pos(high, event)
        return index if inside else None


def _membership_windows(
    user_id: str, stored: Sequence[StoredEvent], window_of: _WindowIndex
) -> dict[tuple[int, str], _Window]:
    """(sync index, room) -> the window of every room whose membership the user changed inside
    some sync's window (events outside every window belong to no sync)."""
    own: dict[tuple[int, str], list[StoredEvent]] = {}
    for event in sorted(stored, key=lambda e: e.stream_ordering):
        if event.type != "m.room.member" or event.state_key != user_id or event.membership is None:
            continue
        if event.stream_ordering <= 0:
            continue
        index = window_of(event)
        if index is not None:
            own.setdefault((index, event.room_id), []).append(event)
    windows: dict[tuple[int, str], _Window] = {}
    for key, events in own.items():
        changes = [str(e.membership) for e in events]
        last = changes[-1]
        window = windows[key] = _Window(changes, set(), [])
        if last == "join":
            window.sections.add("join")
        elif last in ("leave", "ban"):
            window.sections.add("leave")
        else:
            window.sections.add(last)
            settled = max((i for i, m in enumerate(changes) if m not in ("invite", "knock")), default=-1)
            if any(m in ("leave", "ban") for m in changes):
                window.sections.add("leave")
            window.superseded = events[settled + 1 : -1]
    return windows


def check_stored_streams(
    user_id: str,
    records: Sequence[SyncRecord],
    changes: Sequence[StoredChange],
    to_device_sent: Sequence[tuple[str, bool, str]],
    instance_ids: Mapping[str, int],
) -> list[str]:
    """The stored streams of one user's syncs:

    * account data: every change of the user's global account data between the first `since`
      and the last `next_batch` is delivered once, inside its sync's window, in stream order
      (the load writes a new type each time, so each change is its own entry);
    * device lists: the user's own device-list changes: a sync lists the user in `changed` exactly
      when its window holds one of them;
    * to-device: `to_device_sent` is what was sent to this user's device, in order, as (message,
      acknowledged, sender): each message arrives at most once, one sender's in the order sent
      (different senders' sends are not ordered), and every acknowledged one arrives (the readers
      end caught up with every writer).
    """
    if not records:
        return []
    problems: list[str] = []

    def inside(record: SyncRecord, change: StoredChange) -> bool:
        low, high = stream_token(record.since, change.stream), stream_token(record.next_batch, change.stream)
        name = str(instance_ids[change.instance_name])
        return (
            low.get_stream_pos_for_instance(name) < change.stream_id <= high.get_stream_pos_for_instance(name)
        )

    first = SyncRecord("", records[0].since, records[-1].next_batch, ())
    mine = [c for c in changes if c.user_id == user_id and inside(first, c)]
    account = {c.key: c for c in mine if c.stream == "account_data"}
    delivered: dict[str, int] = {}
    last_id = 0
    for index, record in enumerate(records):
        for kind in record.account_data:
            change = account.get(kind)
            if change is None:
                continue  # written before the first since (or not by the load): not this check's
            if kind in delivered:
                problems.append(
                    f"{user_id}: account data {kind} delivered twice (syncs {delivered[kind]}, {index})"
                )
            delivered.setdefault(kind, index)
            if not inside(record, change):
                problems.append(
                    f"{user_id}: account data {kind} ({change.stream_id}) outside its sync's window"
                )
            if change.stream_id < last_id:
                problems.append(f"{user_id}: account data {kind} not in stream order")
            last_id = max(last_id, change.stream_id)
    for kind in sorted(set(account) - set(delivered), key=lambda k: account[k].stream_id):
        problems.append(f"{user_id}: missed account data {kind} ({account[kind].stream_id})")
    own_devices = [c for c in mine if c.stream == "device_lists"]
    for index, record in enumerate(records):
        held = any(inside(record, c) for c in own_devices)
        listed = user_id in record.device_changed
        if held and not listed:
            problems.append(f"{user_id}: missed its own device-list change in sync {index}")
        elif listed and not held:
            problems.append(
                f"{user_id}: sync {index} listed its own device list with no change in its window"
            )
    order = {msg: (sender, n) for n, (msg, _acked, sender) in enumerate(to_device_sent)}
    received = [m for record in records for m in record.to_device]
    last_from: dict[str, int] = {}
    arrived_once: set[str] = set()
    for msg in received:
        if msg not in order:
            problems.append(f"{user_id}: to-device message {msg} was not sent to this device")
            continue
        sender, n = order[msg]
        if msg in arrived_once:
            problems.append(f"{user_id}: to-device message {msg} delivered twice")
        elif n < last_from.get(sender, -1):
            problems.append(f"{user_id}: to-device message {msg} not in stream order")
        arrived_once.add(msg)
        last_from[sender] = max(last_from.get(sender, -1), n)
    arrived = set(received)
    for msg, acked, _sender in to_device_sent:
        if acked and msg not in arrived:
            problems.append(f"{user_id}: missed to-device message {msg}")
    return problems


def check_receipts(
    user_id: str,
    records: Sequence[SyncRecord],
    last_written: Mapping[tuple[str, str, str], str],
    watched_rooms: Iterable[str] = (),
) -> list[str]:
    """Receipts as one reader saw them. Receipts are state, not a log (a later one replaces an
    earlier one), so the check is on values, not on exactly-once:

    * never another user's `m.read.private` receipt;
    * nothing nobody wrote: every receipt seen is one some user's write set at some point (checked
      as: its (room, type, user) was written);
    * in `watched_rooms` (rooms the reader was joined to for the whole run, as the probes are), the
      last value seen of every (room, `m.read`, user) is that user's last receipt there.

    `last_written`: (room, receipt type, user) -> the event of the last receipt that user set, or
    "?" when that write's outcome is unknown (a fault: it may have landed, so it counts as set,
    and the last value is not checked).
    """
    problems: list[str] = []
    latest: dict[tuple[str, str, str], str] = {}
    for index, record in enumerate(records):
        for room_id, kind, user, event_id in record.receipts:
            if kind == "m.read.private" and user != user_id:
                problems.append(f"{user_id}: sync {index} carried {user}'s private receipt in {room_id}")
            if (room_id, kind, user) not in last_written:
                problems.append(
                    f"{user_id}: sync {index} carried a receipt nobody set: {user} {kind} {room_id}"
                )
            latest[(room_id, kind, user)] = event_id
    watched = set(watched_rooms)
    for (room_id, kind, user), event_id in sorted(last_written.items()):
        seen = latest.get((room_id, kind, user))
        if room_id in watched and kind == "m.read" and event_id not in ("?", seen):
            problems.append(f"{user_id}: {user}'s last m.read in {room_id} is {event_id}, last seen {seen}")
    return problems


def check_one_time_keys(
    user_id: str, records: Sequence[SyncRecord], uploaded: Sequence[str], claimed: Sequence[str]
) -> list[str]:
    """One device's one-time keys: each key handed out by a claim was uploaded by this device and
    handed out once, and the count the device's last sync carried is what is left."""
    problems: list[str] = []
    mine = set(uploaded)
    for key in sorted(set(claimed) - mine):
        problems.append(f"{user_id}: claimed key {key} was never uploaded by this device")
    for key in sorted({k for k in claimed if claimed.count(k) > 1}):
        problems.append(f"{user_id}: key {key} was claimed {claimed.count(key)} times")
    counts = [r.one_time_keys for r in records if r.one_time_keys is not None]
    left = len(mine - set(claimed))
    if counts and counts[-1] != left:
        problems.append(f"{user_id}: last sync counted {counts[-1]} one-time keys, {left} are left")
    return problems
