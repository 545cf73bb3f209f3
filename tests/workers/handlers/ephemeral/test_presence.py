"""PresenceTracker (per process instance id, expiry, grace), PresenceSyncTracker (debounce) and
PresenceView on their own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pubsub.wire import ClearUserSync, UserSync
from workers.handlers.ephemeral.presence import PresenceTracker, PresenceView
from workers.handlers.ephemeral.presence_sync import PresenceSyncTracker, new_instance_id


async def _no_send(command: UserSync | ClearUserSync) -> None:
    return None


def test_a_syncing_user_is_online_and_goes_offline_after_the_grace() -> None:
    tracker = PresenceTracker(process_timeout_ms=300_000, offline_grace_ms=30_000)
    [change] = tracker.user_sync("sync1-aa", "@u:x", "D", True, 0, now_ms=1000)
    assert change == ("@u:x", "online", 1000, None, True)
    assert tracker.user_sync("sync1-aa", "@u:x", "D", True, 0, now_ms=2000) == []  # a re-send
    [change] = tracker.user_sync("sync1-aa", "@u:x", "D", False, 5000, now_ms=15_000)
    assert change[1] == "online" and change[4] is False
    assert tracker.tick(34_999) == []
    assert tracker.tick(35_000) == [("@u:x", "offline", 1000, None, False)]


def test_a_silent_process_is_expired_and_its_users_go_offline() -> None:
    tracker = PresenceTracker(process_timeout_ms=10_000, offline_grace_ms=1_000)
    tracker.user_sync("sync1-aa", "@u:x", None, True, 0, now_ms=0)
    tracker.user_sync("sync2-bb", "@v:x", None, True, 0, now_ms=0)
    tracker.heard("sync2-bb", 9_000)
    assert tracker.tick(9_999) == []
    # sync1-aa silent for 10 s: dropped; its user was last seen at 0, past the grace already
    assert tracker.tick(10_000) == [("@u:x", "offline", 0, None, False)]
    assert "sync1-aa" not in tracker.processes() and not tracker.syncing("@u:x")
    assert tracker.get("@v:x").presence == "online"


def test_a_user_syncing_on_two_processes_stays_online_when_one_clears() -> None:
    tracker = PresenceTracker(process_timeout_ms=10_000, offline_grace_ms=0)
    tracker.user_sync("sync1-aa", "@u:x", "D", True, 0, now_ms=0)
    tracker.user_sync("sync2-bb", "@u:x", "E", True, 0, now_ms=0)
    tracker.clear_process("sync1-aa", now_ms=1)
    assert tracker.tick(5) == [] and tracker.get("@u:x").presence == "online"
    tracker.clear_process("sync2-bb", now_ms=6)
    assert tracker.tick(6)[0][1] == "offline"


def test_set_presence_and_status() -> None:
    tracker = PresenceTracker(process_timeout_ms=10_000, offline_grace_ms=60_000)
    [change] = tracker.set_presence("@u:x", "unavailable", "lunch", now_ms=5)
    assert change == ("@u:x", "unavailable", 0, "lunch", False)
    assert tracker.set_presence("@u:x", "unavailable", "lunch", now_ms=6) == []


def test_ends_are_debounced_and_starts_resent() -> None:
    tracker = PresenceSyncTracker("sync1-aa", _no_send, end_delay_s=10)
    assert tracker.enter("@u:x", "D", 0) == UserSync("sync1-aa", "@u:x", "D", "start", 0)
    assert tracker.enter("@u:x", "D", 1) is None  # a second concurrent sync
    tracker.exit("@u:x", "D", 2)
    tracker.exit("@u:x", "D", 3)
    assert tracker.due_ends(9_000) == []
    assert tracker.enter("@u:x", "D", 9_000) is None  # back within the delay: nothing sent
    tracker.exit("@u:x", "D", 9_500)
    assert tracker.starts(10_000) == [UserSync("sync1-aa", "@u:x", "D", "start", 10_000)]
    assert tracker.due_ends(19_499) == []
    assert tracker.due_ends(19_500) == [UserSync("sync1-aa", "@u:x", "D", "end", 9_500)]
    assert tracker.starts(20_000) == []
    assert tracker.clear() == ClearUserSync("sync1-aa")


@given(
    st.lists(st.tuples(st.sampled_from(["@u:x", "@v:x"]), st.booleans(), st.integers(0, 20_000)), max_size=60)
)
def test_the_writer_believes_exactly_who_syncs(ops: list[tuple[str, bool, int]]) -> None:
    """Feeding the sync tracker's commands to the presence tracker: after the delays have run out,
    a user is syncing there exactly when a sync is in flight."""
    sync = PresenceSyncTracker("s-1", _no_send, end_delay_s=10)
    writer = PresenceTracker(process_timeout_ms=10**12, offline_grace_ms=0)
    now, active = 0, {"@u:x": 0, "@v:x": 0}
    for user, entering, step in ops:
        now += step
        commands: list[UserSync] = sync.due_ends(now)
        if entering:
            start = sync.enter(user, None, now)
            commands += [start] if start else []
            active[user] += 1
        elif active[user]:
            sync.exit(user, None, now)
            active[user] -= 1
        for c in commands:
            writer.user_sync(c.instance_id, c.user_id, c.device_id, c.state == "start", c.last_sync_ms, now)
    for c in sync.due_ends(now + 10_000):
        writer.user_sync(c.instance_id, c.user_id, c.device_id, False, c.last_sync_ms, now + 10_000)
    for user, count in active.items():
        assert writer.syncing(user) == (count > 0)


def test_instance_ids_are_new_at_every_start() -> None:
    ids = {new_instance_id("sync1") for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("sync1-") for i in ids)


def test_view_events_since() -> None:
    view = PresenceView()
    view.apply(3, ("@u:x", "online", 1000, None, True))
    view.apply(4, ("@v:x", "offline", 0, "away", False))
    assert [e["sender"] for e in view.events(["@u:x", "@v:x", "@w:x"], None, 2000)] == ["@u:x", "@v:x"]
    [event] = view.events(["@u:x", "@v:x"], 3, 2000)
    assert event == {
        "type": "m.presence",
        "sender": "@v:x",
        "content": {"presence": "offline", "currently_active": False, "status_msg": "away"},
    }
    assert view.events(["@u:x"], None, 2000)[0]["content"]["last_active_ago"] == 1000
