"""The independent auth-rules judge (`workers.harness.auth_rules`): valid histories pass, and each
broken history is reported with the rule it breaks (a checker must be shown to fail)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from workers.harness.auth_rules import RoomReplay, StoredEvent, replay

ROOM = "!r:hs"
ALICE, BOB, CAROL = "@alice:hs", "@bob:hs", "@carol:hs"
PL = {"users": {ALICE: 100}, "users_default": 0, "events_default": 0, "state_default": 50,
      "ban": 50, "kick": 50, "redact": 50, "invite": 0, "events": {"m.room.power_levels": 100}}  # fmt: skip


class History:
    """A room's events in stream order, built step by step."""

    def __init__(self, version: str = "10", join_rule: str = "invite", levels: dict[str, Any] | None = None):
        self.events: list[StoredEvent] = []
        self._ids = itertools.count(1)
        create: dict[str, Any] = {"room_version": version}
        if version != "11":
            create["creator"] = ALICE
        self.state(ALICE, "m.room.create", "", create)
        self.member(ALICE, ALICE, "join")
        self.state(ALICE, "m.room.power_levels", "", levels or PL)
        self.state(ALICE, "m.room.join_rules", "", {"join_rule": join_rule})

    def add(self, sender: str, kind: str, content: dict[str, Any], state_key: str | None = None) -> str:
        n = next(self._ids)
        self.events.append(StoredEvent(n, f"$e{n}", ROOM, kind, sender, content, state_key))
        return f"$e{n}"

    def state(self, sender: str, kind: str, key: str, content: dict[str, Any]) -> str:
        return self.add(sender, kind, content, key)

    def member(self, sender: str, target: str, membership: str) -> str:
        return self.add(sender, "m.room.member", {"membership": membership}, target)

    def message(self, sender: str) -> str:
        return self.add(sender, "m.room.message", {"body": "hi"})

    def rules_broken(self) -> list[tuple[str, str]]:
        """(event id, rule) of every violation."""
        return [(v.event.event_id, v.rule) for v in replay(self.events).violations]


@pytest.mark.parametrize("version", ["10", "11"])
def test_a_valid_history_passes(version: str) -> None:
    h = History(version, levels={**PL, "users": {ALICE: 100, CAROL: 50}})
    h.member(ALICE, BOB, "invite")
    h.member(BOB, BOB, "join")
    h.message(BOB)
    h.state(ALICE, "m.room.power_levels", "", {**PL, "users": {ALICE: 100, BOB: 50, CAROL: 50}})
    h.state(BOB, "m.room.topic", "", {"topic": "t"})
    h.member(ALICE, BOB, "leave")  # a kick
    stray = h.member(CAROL, CAROL, "leave")  # Carol was never in the room
    h.member(ALICE, BOB, "ban")
    h.member(ALICE, BOB, "leave")  # unban
    h.member(ALICE, BOB, "invite")
    h.member(BOB, BOB, "leave")  # reject the invite
    h.state(ALICE, "m.room.join_rules", "", {"join_rule": "knock"})
    h.member(BOB, BOB, "knock")
    h.member(ALICE, BOB, "invite")
    h.member(BOB, BOB, "join")
    own = h.message(BOB)
    h.add(BOB, "m.room.redaction", {"redacts": own})
    h.add(ALICE, "m.room.redaction", {"redacts": own})
    # Carol's leave without a membership breaks 4.5.1: the only violation.
    assert h.rules_broken() == [(stray, "4.5.1")]


def test_an_invite_after_the_targets_join_is_refused() -> None:
    h = History()
    h.member(ALICE, BOB, "invite")
    h.member(BOB, BOB, "join")
    bad = h.member(ALICE, BOB, "invite")
    after = h.message(BOB)  # the refused invite changed nothing: Bob is still joined
    assert h.rules_broken() == [(bad, "4.4.3")]
    assert after


def test_a_message_after_the_senders_leave() -> None:
    h = History(join_rule="public")
    h.member(BOB, BOB, "join")
    h.member(BOB, BOB, "leave")
    bad = h.message(BOB)
    assert h.rules_broken() == [(bad, "5")]


def test_joins_and_knocks_against_the_join_rule() -> None:
    h = History()
    uninvited = h.member(BOB, BOB, "join")
    knock = h.member(CAROL, CAROL, "knock")
    for_other = h.member(BOB, CAROL, "join")
    assert h.rules_broken() == [(uninvited, "4.3.4"), (knock, "4.7.1"), (for_other, "4.3.2")]


def test_an_authorising_user_of_another_server() -> None:
    """Rule 4.2: the authorising user's server must have signed the event, and here only the
    sender's server signs."""
    h = History(join_rule="public")
    foreign = h.add(
        BOB, "m.room.member", {"membership": "join", "join_authorised_via_users_server": "@s:x"}, BOB
    )
    h.add(CAROL, "m.room.member", {"membership": "join", "join_authorised_via_users_server": ALICE}, CAROL)
    assert h.rules_broken() == [(foreign, "4.2")]


@pytest.mark.parametrize("join_rule", ["restricted", "knock_restricted"])
def test_a_restricted_join_needs_a_joined_authoriser_who_may_invite(join_rule: str) -> None:
    """Rule 4.3.5: an invited (or joined) user joins as in an invite room; anyone else only when
    `join_authorised_via_users_server` names a joined member at the invite level."""
    h = History(join_rule=join_rule, levels={**PL, "invite": 50})
    by = {"membership": "join", "join_authorised_via_users_server": ALICE}
    h.add(BOB, "m.room.member", by, BOB)
    bare = h.member(CAROL, CAROL, "join")
    not_joined = h.add(CAROL, "m.room.member", {**by, "join_authorised_via_users_server": "@dave:hs"}, CAROL)
    below_invite = h.add(CAROL, "m.room.member", {**by, "join_authorised_via_users_server": BOB}, CAROL)
    h.member(ALICE, CAROL, "invite")
    h.member(CAROL, CAROL, "join")
    assert h.rules_broken() == [(bare, "4.3.5.2"), (not_joined, "4.3.5.2"), (below_invite, "4.3.5.2")]


def test_a_ban_racing_a_join() -> None:
    h = History(join_rule="public")
    h.member(ALICE, BOB, "ban")
    bad = h.member(BOB, BOB, "join")
    invite = h.member(ALICE, BOB, "invite")
    assert h.rules_broken() == [(bad, "4.3.3"), (invite, "4.4.3")]


def test_kick_ban_and_unban_need_power_over_the_target() -> None:
    levels = {**PL, "users": {ALICE: 100, BOB: 50, CAROL: 50}, "kick": 60}
    h = History(join_rule="public", levels=levels)
    h.member(BOB, BOB, "join")
    h.member(CAROL, CAROL, "join")
    kick = h.member(BOB, CAROL, "leave")  # below the kick level
    ban = h.member(BOB, CAROL, "ban")  # at the ban level, but not above Carol
    h.member(ALICE, CAROL, "ban")
    unban = h.member(BOB, CAROL, "leave")  # ban level 50 but kick level 60: both are needed
    assert h.rules_broken() == [(kick, "4.5.4"), (ban, "4.6.2"), (unban, "4.5.4")]


def test_power_level_changes() -> None:
    levels = {**PL, "users": {ALICE: 100, BOB: 50, CAROL: 50}}
    h = History(join_rule="public", levels=levels)
    h.member(BOB, BOB, "join")
    h.member(CAROL, CAROL, "join")
    h.state(ALICE, "m.room.power_levels", "", {**levels, "events": {}})  # Bob may now send them
    above = h.state(
        BOB, "m.room.power_levels", "", {**levels, "events": {}, "users": {ALICE: 100, BOB: 60, CAROL: 50}}
    )
    peer = h.state(
        BOB, "m.room.power_levels", "", {**levels, "events": {}, "users": {ALICE: 100, BOB: 50, CAROL: 0}}
    )
    top = h.state(BOB, "m.room.power_levels", "", {**levels, "events": {}, "kick": 70})
    stringy = h.state(ALICE, "m.room.power_levels", "", {**levels, "ban": "50"})
    h.state(ALICE, "m.room.power_levels", "", {**levels, "events": {"m.room.topic": 100}})
    topic = h.state(BOB, "m.room.topic", "", {"topic": "t"})
    assert h.rules_broken() == [(above, "9.9"), (peer, "9.8"), (top, "9.5"), (stringy, "9.1"), (topic, "7")]


def test_state_keys_of_other_users_and_a_second_create() -> None:
    h = History()
    other = h.state(ALICE, "m.custom", BOB, {})
    create = h.state(ALICE, "m.room.create", "", {"creator": ALICE, "room_version": "10"})
    assert h.rules_broken() == [(other, "8"), (create, "1.1")]


def test_redacting_anothers_event_needs_the_redact_level() -> None:
    h = History(join_rule="public")
    h.member(BOB, BOB, "join")
    own = h.message(ALICE)
    bad = h.add(BOB, "m.room.redaction", {"redacts": own})
    assert h.rules_broken() == [(bad, "C-S redact")]


@pytest.mark.parametrize(("version", "refused"), [("10", False), ("11", True)])
def test_a_redacted_power_levels_event_counts_as_pruned(version: str, refused: bool) -> None:
    """v10's redaction drops `invite` from power levels (back to its default 0); v11 keeps it."""
    h = History(version, join_rule="public", levels={**PL, "invite": 50})
    h.member(BOB, BOB, "join")
    pl = next(e.event_id for e in h.events if e.type == "m.room.power_levels")
    h.add(ALICE, "m.room.redaction", {"redacts": pl})
    invite = h.member(BOB, CAROL, "invite")
    assert h.rules_broken() == ([(invite, "4.4.4")] if refused else [])


def test_the_create_event_by_version() -> None:
    v11 = History("11")  # no creator: the create event's sender is the creator
    assert v11.rules_broken() == []
    room = RoomReplay(ROOM)
    bad = StoredEvent(1, "$c", ROOM, "m.room.create", ALICE, {"room_version": "10"}, "")
    assert room.judge(bad) is not None and room.violations[0].rule == "1.4"
    other_domain = StoredEvent(1, "$d", "!r:elsewhere", "m.room.create", ALICE, {"room_version": "11"}, "")
    assert [v.rule for v in replay([other_domain]).violations] == ["1.2"]


def test_a_room_without_its_create_event_is_not_judged() -> None:
    result = replay(
        [StoredEvent(1, "$i", "!remote:other", "m.room.member", "@x:other", {"membership": "invite"}, ALICE)]
    )
    assert (result.rooms, result.foreign_rooms, result.violations) == (0, 1, ())
