"""Writes into rooms, from any worker: the client never needs to know which persister owns a room.

Every event of a room goes through the room's persister (`workers.routing`). `RoomWrites.send`
and friends run on whichever worker the client reached:
* on the room's persister, the event is checked against the room's rules and persisted here;
* elsewhere it is forwarded to the owner (`Forwarder`, an authenticated worker request), and the
  answer waits until this worker's own token covers the event, so a client that sends and then
  syncs on the same worker sees its event (read-your-writes, `workers.handlers.notify.visibility`);
  an answer that goes out before that is counted in `late_answers`.

Idempotency: a send with a client transaction id gets an event id derived from (room, sender,
device, txn) (`rooms.txn_event_id`). A retry that arrives while the first try is in flight shares
its result; one that arrives after it was stored gets the stored event back, also after a persister
restart: the persister looks such sends up before it takes stream IDs (`persist(may_exist=True)`),
so a retry costs no stream ID and no follower catches up for it. Every other room write gets its
event id here too, before it is forwarded, so the forwarding worker may repeat it (on the same
owner, or on the next holder of a room that moved): the owner answers a repeat with the stored
event, whether the room's rules would refuse it now or the insert meets the unique event id.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import asyncpg

from idgen import MultiWriterIdGenerator
from workers import identifiers
from workers.errors import RoomRuleError
from workers.handlers.notify.notifier import Notifier
from workers.handlers.notify.visibility import wait_visible
from workers.handlers.placement.forwarding import Forwarder, OwnerUnavailable
from workers.handlers.placement.room_leases import RoomLeases
from workers.handlers.placement.routed import OwnerWaits, routed
from workers.handlers.rooms import relations, stored_checks
from workers.handlers.rooms import rules as rooms
from workers.handlers.rooms.admission import RULES, Claim, RoomAdmission, Ticket, member
from workers.handlers.rooms.deletions import RoomDeletions
from workers.handlers.rooms.forwarded import RemoteInvite, Written, event_to_json
from workers.handlers.rooms.persist import EventPersister
from workers.handlers.rooms.purge import PurgeOptions, PurgeResult, RoomEnd, RoomGate
from workers.handlers.rooms.versions import REDACTION_EVENT
from workers.model import CREATE_EVENT, MEMBER_EVENT, SUPPORTED_ROOM_VERSIONS, NewEvent
from workers.routing import RoomPlacement, writer_for_room
from workers.storage import rooms as room_store
from workers.storage.purge import BLOCKED_ROOM

MAX_BACKFILL = 500
T = TypeVar("T")


class RoomWrites:
    """A worker's room writes: sent on to the room's owner, or checked and persisted here when this
    worker owns the room. Everything it needs comes at construction; `writers` and `placement`
    change online (a reload)."""

    def __init__(
        self,
        instance_name: str,
        event_writers: Sequence[str],
        pool: asyncpg.Pool,
        persister: EventPersister | None,
        backfill: EventPersister | None,
        room_views: rooms.RoomViews,
        events_generator: MultiWriterIdGenerator,
        notifier: Notifier,
        server_name: str,
        *,
        forwarder: Forwarder | None = None,
        leases: RoomLeases | None = None,
        hears: Callable[[str], bool] = lambda _writer: True,
        end: RoomEnd | None = None,
        deletions: RoomDeletions | None = None,
        gate: RoomGate | None = None,
        owner_wait_s: float = 0.0,
        by_hash: Callable[[], bool] | None = None,
    ) -> None:
        self.name = instance_name
        self.writers = list(event_writers)
        self._pool = pool
        self._checks = stored_checks.StoredChecks(pool)
        self._persister = persister
        self._backfill = backfill
        self._views = room_views
        self._events = events_generator
        self._notifier = notifier
        self.server_name = server_name
        #: Worker requests to the room's owner (None: this worker cannot forward).
        self.forwarder = forwarder
        self.placement = RoomPlacement(self.writers, time.monotonic)
        if by_hash is not None:  # while workers of the previous release run: rooms by the hash
            self.placement.by_hash = by_hash
        #: The room leases this worker holds, when it writes events.
        self.leases = leases
        #: Whether this worker currently hears a writer's events live (replication connected and
        #: its first POSITION seen); while it does not, waiting to see an event is pointless.
        self.hears = hears
        self._in_flight: dict[str, asyncio.Future[Written]] = {}
        #: The purge and last-member clean-up of the rooms written here (None: not set up).
        self.end = end
        #: The Delete Room API's version 2 tasks of the rooms written here (None: not set up).
        self.deletions = deletions
        #: Writes admitted per room; a purge holds its room here (`RoomEnd` shares it).
        self.gate = gate or RoomGate()
        #: Per room: each write checked against the state the writes before it that it depends on left.
        self.admission = RoomAdmission()
        #: How long a write keeps trying an owner that cannot take it now (restarting, stopping).
        self.owner_wait_s = owner_wait_s
        self.forwarded = 0
        self.late_answers = 0
        #: Writes that had to wait for their owner, and the longest such wait.
        self.owner_waits = OwnerWaits()

    # -- any worker -----------------------------------------------------------------------------

    def owner(self, room_id: str) -> str:
        """Where `room_id`'s writes go now (`RoomPlacement`)."""
        return self.placement.owner(room_id)

    def new_room_id(self) -> str:
        """A fresh room id whose stable writer is this worker when it writes events, else a random
        writer (the first write takes the room's lease there)."""
        target = self.name if self.name in self.writers else random.choice(self.writers)
        while True:
            room_id = identifiers.new_room_id(self.server_name)
            if writer_for_room(room_id, self.writers) == target:
                return room_id

    async def send(
        self, event: NewEvent, *, txn: bool = False, target_was: frozenset[str] | None = None
    ) -> Written:
        """Check and persist `event` on its room's owner. `target_was`: a member event acts on a
        target in one of these memberships, checked in the room's order with the rules (`/kick`
        acts on a member, an invitee or a knocker, `/unban` on a banned user: a kick that lands
        after a ban would otherwise lift it). Raises RoomRuleError subclasses, PersisterError,
        OwnerUnavailable or ForwardRefused."""
        body: dict[str, Any] = {"event": event_to_json(event), "txn": txn}
        if target_was is not None:
            body["target_was"] = sorted(target_was)
        return await self._routed(
            event.room_id, lambda: self.send_here(event, txn=txn, target_was=target_was),
            lambda owner: self._forward_written(owner, "room_send", event.room_id, "send", body, retry=True),
            retry=True,
        )  # fmt: skip

    async def create(self, events: list[NewEvent]) -> Written:
        """Persist a new room's first events (`room_plan.plan_room`) on its owner; the last one's place."""
        room_id = events[0].room_id
        body = {"events": [event_to_json(e) for e in events]}
        return await self._routed(
            room_id, lambda: self.create_here(events),
            lambda owner: self._forward_written(owner, "room_create", room_id, "create", body, retry=True),
            retry=True,
        )  # fmt: skip

    async def remote_invite(self, invite: RemoteInvite) -> Written:
        """Store an invite a remote server sent (the stand-in for federation's invite) on the
        room's owner: the room's version, the state the invite showed, the invite event."""
        room_id = invite.room_id
        return await self._routed(
            room_id, lambda: self.remote_invite_here(invite),
            lambda owner: self._forward_written(
                owner, "room_remote_invite", room_id, "remote_invite", invite.to_json(), retry=True
            ),
            retry=True,
        )  # fmt: skip

    async def backfill(self, room_id: str, sender: str, items: Any) -> list[int]:
        """Import history (negative stream orderings) into a room `sender` is joined to."""

        async def forward(owner: str) -> list[int]:
            body = {"sender": sender, "events": items}
            answer = await self._forward(owner, "room_backfill", room_id, "backfill", body, retry=False)
            orderings = answer.get("stream_orderings")
            if not isinstance(orderings, list):
                raise OwnerUnavailable(owner, "answered without stream_orderings")
            return [int(o) for o in orderings]

        here = lambda: self.backfill_here(room_id, sender, items)  # noqa: E731
        return await self._routed(room_id, here, forward, retry=False)

    async def _routed(
        self,
        room_id: str,
        here: Callable[[], Awaitable[T]],
        forward: Callable[[str], Awaitable[T]],
        *,
        retry: bool,
    ) -> T:
        """Run the write on the room's owner: `here` when that is this worker, else `forward`;
        followed to the room's holder and retried for up to `owner_wait_s`
        (`workers.handlers.placement.routed`)."""
        return await routed(
            self.placement, room_id, self.name, here, forward,
            retry=retry, within_s=self.owner_wait_s, waits=self.owner_waits,
        )  # fmt: skip

    async def _forward_written(
        self, owner: str, endpoint: str, room_id: str, op: str, body: dict[str, Any], *, retry: bool
    ) -> Written:
        answer = await self._forward(owner, endpoint, room_id, op, body, retry=retry)
        return await self._visible(Written.from_json(answer))

    async def purge(self, room_id: str, options: PurgeOptions) -> PurgeResult:
        """Delete a room on its owner (`workers.handlers.rooms.purge`): not retried, it ends users'
        memberships."""

        async def forward(owner: str) -> PurgeResult:
            answer = await self._forward(
                owner, "room_purge", room_id, "purge", options.to_json(), retry=False
            )
            return PurgeResult.from_json(owner, answer)

        return await self._routed(room_id, lambda: self.purge_here(room_id, options), forward, retry=False)

    async def purge_here(self, room_id: str, options: PurgeOptions) -> PurgeResult:
        if self.end is None:
            raise OwnerUnavailable(self.name, "this worker does not write events or the caches stream")
        return await self.end.purge(room_id, options)

    async def start_deletion(self, room_id: str, options: PurgeOptions) -> str:
        """Start a room's deletion as a task on its owner (`workers.handlers.rooms.deletions`); its
        delete id."""

        async def forward(owner: str) -> str:
            answer = await self._forward(
                owner, "room_delete", room_id, "delete", options.to_json(), retry=False
            )
            delete_id = answer.get("delete_id")
            if not isinstance(delete_id, str):
                raise OwnerUnavailable(owner, "answered a deletion without delete_id")
            return delete_id

        return await self._routed(
            room_id, lambda: self.start_deletion_here(room_id, options), forward, retry=False
        )

    async def start_deletion_here(self, room_id: str, options: PurgeOptions) -> str:
        if self.deletions is None:
            raise OwnerUnavailable(self.name, "this worker does not write events or the caches stream")
        return await self.deletions.start(room_id, options)

    async def _forward(
        self, owner: str, endpoint: str, room_id: str, op: str, body: dict[str, Any], *, retry: bool
    ) -> dict[str, Any]:
        """One worker request to the room's owner. `retry`: the request may be repeated after it
        may have reached the owner (a send, a create and a remote invite carry their event ids, so
        the owner answers a repeat with the stored event; a backfill gets its ids on the owner and
        fails with OwnerUnavailable instead)."""
        if self.forwarder is None:
            raise OwnerUnavailable(owner, "worker requests are not set up on this worker")
        self.forwarded += 1
        path = f"/_fanout/internal/rooms/{quote(room_id, safe='')}/{op}"
        return await self.forwarder.request(owner, endpoint, "POST", path, body=body, idempotent=retry)

    async def _visible(self, written: Written) -> Written:
        """Wait until this worker's token covers `written` (bounded; counted when it is not)."""
        if not await wait_visible(
            self._events, written.instance_name, written.stream_ordering, self._notifier, self.hears
        ):
            self.late_answers += 1
        return written

    # -- the room's owner -----------------------------------------------------------------------

    def _persister_here(self, backfill: bool = False) -> EventPersister:
        persister = self._backfill if backfill else self._persister
        if persister is None:
            raise OwnerUnavailable(self.name, "this worker does not write events")
        return persister

    async def send_here(
        self, event: NewEvent, *, txn: bool = False, target_was: frozenset[str] | None = None
    ) -> Written:
        """Check `event` against the room's rules and persist it (on the room's owner)."""
        pending = self._in_flight.get(event.event_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
        self._in_flight[event.event_id] = future
        try:
            written = await self._check_and_persist(event, txn, target_was)
        except BaseException as e:
            if not future.done():
                future.set_exception(e)
                future.exception()  # retrieved: a lone first try must not log "never retrieved"
            raise
        finally:
            del self._in_flight[event.event_id]
        future.set_result(written)
        return written

    async def _hold(self, room_id: str) -> None:
        if self.leases is not None:
            await self.leases.hold(room_id)

    async def _check_and_persist(
        self, event: NewEvent, txn: bool, target_was: frozenset[str] | None
    ) -> Written:
        with self.gate.write(event.room_id):
            ticket = await self.admission.enter(event.room_id, claim_of(event))
            try:
                written = await self._check_and_persist_admitted(event, txn, ticket, target_was)
            finally:
                ticket.release()  # unless the persist future holds it (`Ticket.release_after`)
        if self.end is not None and event.type == MEMBER_EVENT and event.membership in ("leave", "ban"):
            await self.end.after_leave(event.room_id)  # never raises: the leave is done
        return written

    async def _check_and_persist_admitted(
        self, event: NewEvent, txn: bool, ticket: Ticket, target_was: frozenset[str] | None
    ) -> Written:
        persister = self._persister_here()
        await self._hold(event.room_id)
        target = event.state_key if event.type == MEMBER_EVENT else None
        view = await self._views.view(event.room_id, event.sender, target, rooms.authoriser_of(event))
        try:
            # As Synapse orders them: an unban's target is checked before a repeat is recognised,
            # a kick's after (a retried kick is answered with the first).
            off_target = stored_checks.off_target(event, target_was, view)
            if off_target is not None and "ban" in (target_was or ()):
                raise off_target
            repeat = await self._checks.repeated(event, view)
            if repeat is not None:
                return Written.of(repeat)
            if off_target is not None:
                raise off_target
            rooms.check(event, view)
            await self._checks.after_rules(event, view)
        except RoomRuleError:
            stored = await self._checks.stored(event.event_id)
            if stored is not None:  # a repeat of a write the rules allowed then
                return Written.of(stored)
            raise
        return Written.of(await _persisted(ticket, persister.persist(event, may_exist=txn)))

    async def create_here(self, events: list[NewEvent]) -> Written:
        with self.gate.write(events[0].room_id):
            ticket = await self.admission.enter(events[0].room_id, Claim.whole_room())
            try:
                return await self._create_admitted(events, ticket)
            finally:
                ticket.release()

    async def _create_admitted(self, events: list[NewEvent], ticket: Ticket) -> Written:
        persister = self._persister_here()
        room_id = events[0].room_id
        if events[0].type != CREATE_EVENT or any(e.room_id != room_id for e in events):
            raise rooms.BadEvent("a new room starts with m.room.create, all events in the room")
        await self._hold(room_id)
        if (await self._views.rooms.get(room_id)).exists:
            stored = await self._checks.stored(events[-1].event_id)
            if stored is not None:  # a retried request that was done the first time
                return Written.of(stored)
            raise rooms.Forbidden(f"{room_id} exists")
        await self._checks.planned(events)
        persisted = await _persisted(ticket, asyncio.ensure_future(persister.persist_many(events)))
        return Written.of(persisted[-1])

    async def remote_invite_here(self, invite: RemoteInvite) -> Written:
        with self.gate.write(invite.room_id):
            ticket = await self.admission.enter(invite.room_id, Claim.whole_room())
            try:
                return await self._remote_invite_admitted(invite, ticket)
            finally:
                ticket.release()

    async def _remote_invite_admitted(self, invite: RemoteInvite, ticket: Ticket) -> Written:
        persister = self._persister_here()
        await self._hold(invite.room_id)
        if invite.room_version not in SUPPORTED_ROOM_VERSIONS:
            raise rooms.IncompatibleRoomVersion(
                f"room version {invite.room_version!r} is not one of {list(SUPPORTED_ROOM_VERSIONS)}"
            )
        event = invite.event
        if invite.invitee.partition(":")[2] != self.server_name:
            raise rooms.BadEvent(f"{invite.invitee} is not a user of {self.server_name}")
        if event.sender.partition(":")[2] == self.server_name:
            raise rooms.Forbidden("an invite from a local user is sent with /invite, not over federation")
        room = await self._views.rooms.get(invite.room_id)
        if room.blocked:
            raise rooms.Forbidden(BLOCKED_ROOM)
        if room.exists and room.remote_version is None:
            raise rooms.Forbidden(f"{invite.room_id} lives on this server")
        stored = await self._checks.stored(event.event_id)
        if stored is not None:  # a retried invite
            return Written.of(stored)
        async with self._pool.acquire() as conn, conn.transaction():
            await room_store.store_remote_invite(
                conn, invite.room_id, invite.room_version, invite.invitee, event.event_id, invite.invite_state
            )
        self._views.rooms.invalidate(invite.room_id)
        return Written.of(await _persisted(ticket, persister.persist(event)))

    async def backfill_here(self, room_id: str, sender: str, items: Any) -> list[int]:
        with self.gate.write(room_id):
            ticket = await self.admission.enter(room_id, Claim(frozenset({RULES, member(sender)})))
            try:
                return await self._backfill_admitted(room_id, sender, items, ticket)
            finally:
                ticket.release()

    async def _backfill_admitted(self, room_id: str, sender: str, items: Any, ticket: Ticket) -> list[int]:
        persister = self._persister_here(backfill=True)
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_BACKFILL:
            raise rooms.BadEvent(f"events must be a list of 1 to {MAX_BACKFILL} objects")
        await self._hold(room_id)
        view = await self._views.view(room_id, sender, None)
        if not view.exists:
            raise rooms.NotFound(f"no room {room_id}")
        if view.sender_membership != "join":
            raise rooms.Forbidden(f"{sender} is not in {room_id}")
        events: list[NewEvent] = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("content", {}), dict):
                raise rooms.BadEvent("each event is {type, content} (state_key optional)")
            try:
                kind = identifiers.check_event_type(str(item.get("type", "")))
            except ValueError as e:
                raise rooms.BadEvent(str(e)) from None
            event = NewEvent(rooms.new_event_id(), room_id, kind, sender, item.get("content", {}))
            rooms.fits(event)  # as any event; and only what the sender may send now
            if (refusal := view.power.may_send(sender, kind, False)) is not None:
                raise rooms.Forbidden(refusal)
            events.append(event)
        persisted = await _persisted(ticket, asyncio.ensure_future(persister.persist_many(events)))
        return [e.stream_ordering for e in persisted]


def claim_of(event: NewEvent) -> Claim:
    """What `event`'s check reads of its room's state (the rules, the sender's membership, and a
    member event's target's and authorising user's) and what the event may change
    (`workers.handlers.rooms.admission`): a member event its target's membership; power levels,
    join rules, a create and a redaction (which may prune one of those) the room's rules; an
    annotation its own (sender, parent, key), so an equal one is checked after it is stored
    (`relations`); anything else nothing the rules read."""
    sender = member(event.sender)
    if event.type == MEMBER_EVENT and event.state_key is not None:
        authoriser = rooms.authoriser_of(event)
        reads = {RULES, sender} if authoriser is None else {RULES, sender, member(authoriser)}
        return Claim(frozenset(reads), frozenset({member(event.state_key)}))
    if event.type == REDACTION_EVENT or (event.state_key is not None and event.type in rooms.RULE_EVENTS):
        return Claim(frozenset({sender}), frozenset({RULES}))
    annotation = relations.annotation_part(event)
    return Claim(frozenset({RULES, sender}), frozenset() if annotation is None else frozenset({annotation}))


async def _persisted(ticket: Ticket, future: asyncio.Future[T]) -> T:
    """`future`'s result, the room held by `ticket` until it is done: a request cancelled while
    its event is queued leaves the room held until the batch committed or failed, so the next event
    is never checked against state that event may still change."""
    await ticket.release_after(future)
    return future.result()
