"""The per-room admission of writes (`workers.handlers.room_admission`): messages together, state
changes alone, first come first served, bounded, and never leaked."""

from __future__ import annotations

import asyncio

import pytest

from workers.handlers.room_admission import AdmissionFull, RoomAdmission, Ticket


async def _entered(admission: RoomAdmission, room: str, *, exclusive: bool) -> asyncio.Task[Ticket]:
    task = asyncio.create_task(admission.enter(room, exclusive=exclusive))
    await asyncio.sleep(0)
    return task


async def test_messages_enter_together_and_a_state_change_waits_for_them() -> None:
    admission = RoomAdmission()
    first = await admission.enter("!r", exclusive=False)
    second = await admission.enter("!r", exclusive=False)
    state = await _entered(admission, "!r", exclusive=True)
    other_room = await admission.enter("!other", exclusive=True)  # rooms are independent
    assert not state.done()
    first.release()
    await asyncio.sleep(0)
    assert not state.done()
    second.release()
    ticket = await asyncio.wait_for(state, 1)
    assert ticket.exclusive
    ticket.release()
    other_room.release()
    assert len(admission) == 0


async def test_first_come_first_served() -> None:
    """A message that arrives after a waiting state change waits behind it: neither starves."""
    admission = RoomAdmission()
    message = await admission.enter("!r", exclusive=False)
    state = await _entered(admission, "!r", exclusive=True)
    later = await _entered(admission, "!r", exclusive=False)
    message.release()
    await asyncio.sleep(0)
    assert state.done() and not later.done()
    state.result().release()
    (await asyncio.wait_for(later, 1)).release()
    assert len(admission) == 0


async def test_a_ticket_handed_to_a_future_holds_the_room_until_it_is_done() -> None:
    admission = RoomAdmission()
    ticket = await admission.enter("!r", exclusive=True)
    batch: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    ticket.release_after(batch)
    ticket.release()  # what the request's `finally` does: the future owns the ticket now
    waiting = await _entered(admission, "!r", exclusive=False)
    await asyncio.sleep(0.01)
    assert not waiting.done()
    batch.set_exception(RuntimeError("the batch failed"))
    batch.exception()
    (await asyncio.wait_for(waiting, 1)).release()
    assert len(admission) == 0


async def test_a_cancelled_waiter_leaves_the_line() -> None:
    admission = RoomAdmission()
    holder = await admission.enter("!r", exclusive=True)
    cancelled = await _entered(admission, "!r", exclusive=True)
    behind = await _entered(admission, "!r", exclusive=False)
    cancelled.cancel()
    holder.release()  # the cancelled waiter has not resumed yet: it must be skipped, not admitted
    ticket = await asyncio.wait_for(behind, 1)
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    ticket.release()
    assert len(admission) == 0


async def test_a_waiter_cancelled_as_it_is_admitted_hands_its_turn_on() -> None:
    admission = RoomAdmission()
    holder = await admission.enter("!r", exclusive=True)
    admitted = await _entered(admission, "!r", exclusive=True)
    behind = await _entered(admission, "!r", exclusive=True)
    holder.release()  # admits `admitted`, which is cancelled before it runs again
    admitted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admitted
    (await asyncio.wait_for(behind, 1)).release()
    assert len(admission) == 0


async def test_the_line_is_bounded() -> None:
    admission = RoomAdmission(max_waiting=2)
    holder = await admission.enter("!r", exclusive=True)
    waiting = [await _entered(admission, "!r", exclusive=False) for _ in range(2)]
    with pytest.raises(AdmissionFull):
        await admission.enter("!r", exclusive=False)
    assert admission.refused == 1
    holder.release()
    holder.release()  # idempotent
    for task in waiting:
        (await asyncio.wait_for(task, 1)).release()
    assert len(admission) == 0 and admission.waits == 2
