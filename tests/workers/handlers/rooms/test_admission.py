"""The per-room admission of writes (`workers.handlers.rooms.admission`): writes that read the same
parts of a room's state together, a change of a part alone, first come first served among writes
that conflict, bounded, and never leaked."""

from __future__ import annotations

import asyncio

import pytest

from workers.handlers.rooms.admission import RULES, AdmissionFull, Claim, RoomAdmission, Ticket, member


def message(sender: str = "@a") -> Claim:
    return Claim(frozenset({RULES, member(sender)}))


def membership(sender: str, target: str) -> Claim:
    return Claim(frozenset({RULES, member(sender)}), frozenset({member(target)}))


RULES_CHANGE = Claim(frozenset({member("@a")}), frozenset({RULES}))
WHOLE = Claim.whole_room()


async def _entered(admission: RoomAdmission, room: str, claim: Claim) -> asyncio.Task[Ticket]:
    task = asyncio.create_task(admission.enter(room, claim))
    await asyncio.sleep(0)
    return task


async def test_messages_enter_together_and_a_change_of_the_rules_waits_for_them() -> None:
    admission = RoomAdmission()
    first = await admission.enter("!r", message("@a"))
    second = await admission.enter("!r", message("@b"))
    state = await _entered(admission, "!r", RULES_CHANGE)
    other_room = await admission.enter("!other", WHOLE)  # rooms are independent
    assert not state.done()
    first.release()
    await asyncio.sleep(0)
    assert not state.done()
    second.release()
    ticket = await asyncio.wait_for(state, 1)
    assert ticket.claim == RULES_CHANGE
    ticket.release()
    other_room.release()
    assert len(admission) == 0


async def test_first_come_first_served() -> None:
    """A message that arrives after a waiting state change waits behind it: neither starves."""
    admission = RoomAdmission()
    sent = await admission.enter("!r", message())
    state = await _entered(admission, "!r", RULES_CHANGE)
    later = await _entered(admission, "!r", message("@b"))
    sent.release()
    await asyncio.sleep(0)
    assert state.done() and not later.done()
    state.result().release()
    (await asyncio.wait_for(later, 1)).release()
    assert len(admission) == 0


async def test_a_ticket_handed_to_a_future_holds_the_room_until_it_is_done() -> None:
    admission = RoomAdmission()
    ticket = await admission.enter("!r", RULES_CHANGE)
    batch: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    ticket.release_after(batch)
    ticket.release()  # what the request's `finally` does: the future owns the ticket now
    waiting = await _entered(admission, "!r", message())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    batch.set_exception(RuntimeError("the batch failed"))
    batch.exception()
    (await asyncio.wait_for(waiting, 1)).release()
    assert len(admission) == 0


async def test_a_request_cancelled_while_its_batch_runs_leaves_the_batch_and_the_room_held() -> None:
    admission = RoomAdmission()
    ticket = await admission.enter("!r", RULES_CHANGE)
    batch: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def request() -> int:
        await ticket.release_after(batch)
        return batch.result()

    answering = asyncio.ensure_future(request())
    await asyncio.sleep(0)
    answering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await answering
    assert not batch.cancelled()
    waiting = await _entered(admission, "!r", message())
    await asyncio.sleep(0.01)
    assert not waiting.done()  # the batch may still change the room's rules
    batch.set_exception(RuntimeError("the batch failed"))
    await asyncio.sleep(0)
    assert batch._log_traceback is False  # retrieved for the request that went away: no warning
    (await asyncio.wait_for(waiting, 1)).release()
    assert len(admission) == 0


async def test_a_finished_batch_wakes_its_request_after_releasing_the_room() -> None:
    admission = RoomAdmission()
    ticket = await admission.enter("!r", RULES_CHANGE)
    batch: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiter = ticket.release_after(batch)
    batch.set_result(7)
    await waiter
    assert batch.result() == 7 and len(admission) == 0


async def test_a_cancelled_waiter_leaves_the_line() -> None:
    admission = RoomAdmission()
    holder = await admission.enter("!r", WHOLE)
    cancelled = await _entered(admission, "!r", WHOLE)
    behind = await _entered(admission, "!r", message())
    cancelled.cancel()
    holder.release()  # the cancelled waiter has not resumed yet: it must be skipped, not admitted
    ticket = await asyncio.wait_for(behind, 1)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    ticket.release()
    assert len(admission) == 0


async def test_a_waiter_cancelled_as_it_is_admitted_hands_its_turn_on() -> None:
    admission = RoomAdmission()
    holder = await admission.enter("!r", WHOLE)
    admitted = await _entered(admission, "!r", WHOLE)
    behind = await _entered(admission, "!r", WHOLE)
    holder.release()  # admits `admitted`, which is cancelled before it runs again
    admitted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admitted
    (await asyncio.wait_for(behind, 1)).release()
    assert len(admission) == 0


async def test_the_line_is_bounded() -> None:
    admission = RoomAdmission(max_waiting=2)
    holder = await admission.enter("!r", WHOLE)
    waiting = [await _entered(admission, "!r", message()) for _ in range(2)]
    with pytest.raises(AdmissionFull):
        await admission.enter("!r", message())
    assert admission.refused == 1
    holder.release()
    holder.release()  # idempotent
    for task in waiting:
        (await asyncio.wait_for(task, 1)).release()
    assert len(admission) == 0 and admission.waits == 2


async def test_a_membership_change_holds_only_its_targets_writes() -> None:
    """Bob's join waits for nothing of Alice's and holds up only what reads Bob's membership: his
    own message, and an invite of him, which waits in line; Carol's message does not."""
    admission = RoomAdmission()
    alice = await admission.enter("!r", message("@alice"))
    join = await admission.enter("!r", membership("@bob", "@bob"))
    bobs_message = await _entered(admission, "!r", message("@bob"))
    invite = await _entered(admission, "!r", membership("@alice", "@bob"))
    carol = await admission.enter("!r", message("@carol"))  # overtakes the conflicting waiters
    assert not bobs_message.done() and not invite.done()
    rules = await _entered(admission, "!r", RULES_CHANGE)
    join.release()
    ticket = await asyncio.wait_for(bobs_message, 1)
    assert not invite.done()  # Bob's message reads his membership, which the invite changes
    ticket.release()
    (await asyncio.wait_for(invite, 1)).release()
    assert not rules.done()  # Alice's and Carol's messages still read the rules
    alice.release()
    carol.release()
    (await asyncio.wait_for(rules, 1)).release()
    assert len(admission) == 0


def test_claims_conflict_when_one_changes_what_the_other_reads_or_changes() -> None:
    assert not message("@a").conflicts(message("@a"))
    assert message("@b").conflicts(membership("@a", "@b"))
    assert not message("@c").conflicts(membership("@a", "@b"))
    assert membership("@a", "@b").conflicts(membership("@c", "@b"))
    assert RULES_CHANGE.conflicts(message("@z"))
    assert WHOLE.conflicts(Claim(frozenset()))
