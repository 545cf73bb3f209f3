"""A realistic load on a running cluster, with sync readers that record what they saw, and the check.

Users join and leave rooms, send messages and change room state (any worker takes each write and
forwards it to the room's persister), and write to the stored streams: global account data (a new
type each time), to-device messages to another user's device, and device keys (a device-list
change). Membership churns too: in quick succession a user leaves or is kicked or banned (and
unbanned), is invited again, knocks on the knock room, and joins again, so that one sync window
holds several changes. Every user long-polls /sync the whole time, switching between the
sync workers (tokens must carry over), and records each answer (its timelines, its own invites
and knocks, and which rooms it listed under which section); every fourth reader pauses between
syncs, as a client on a slow network does, so its windows span whole churns. One probe user per sync worker,
in every room, timestamps arrivals to measure persist-to-visible latency on every sync worker.
The actions start once every reader but the laggards has read what the setup wrote.
With `with_racing_clients` (the demo and `make chaos`), the clients that found issue 42's races
join in: pairs of membership changes to one user sent at once through two workers
(`workers.harness.race_load`), every other reader moving to another sync worker at each request,
and two laggards that sync rarely with a timeline limit of 3 (`workers.harness.laggard`); sends
go through any worker, a persister other than the room's among them (counted).
At the end the recorded histories are checked against the events and stored streams' tables and
what was sent (workers.harness.history).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from workers.harness import churn
from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.harness.laggard import LagClock, LaggardReader
from workers.harness.load_check import LoadReport, verify_load
from workers.harness.race_load import MembershipRacer
from workers.harness.sync_reader import SyncReader
from workers.harness.written import covers, written_positions
from workers.storage import connect

Progress = Callable[[int, int, str], None]


@dataclass
class LoadPlan:
    users: int = 24
    rooms: int = 8
    rooms_per_user: int = 3
    actions: int = 3000
    concurrency: int = 16
    sync_timeout_ms: int = 2000
    seed: int = 7
    #: The cluster has typing and presence writers: their notifications must reach the readers.
    expect_ephemeral: bool = False
    #: Readers whose /sync is refused start over with an initial sync (counted) instead of failing.
    start_over: bool = False
    #: The share of actions that race two membership changes to one user through two workers.
    race_share: float = 0.0
    #: Users (never the rooms' owner) whose reader is a laggard (`workers.harness.laggard`).
    laggards: int = 0
    #: Every other reader moves to another sync worker at each request (else every third).
    hopping_readers: bool = False


def with_racing_clients(plan: LoadPlan) -> LoadPlan:
    """`plan` with the clients that found issue 42's races: racing membership pairs, readers
    hopping between sync workers, two laggards (the demo's and `make chaos`'s load)."""
    return dataclasses.replace(plan, race_share=0.03, laggards=2, hopping_readers=True)


class LoadDriver:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: dict[str, str],
        event_writers: Sequence[str],
        sync_workers: Sequence[str],
        database_url: str,
        plan: LoadPlan,
    ) -> None:
        self.session = session
        self.urls = urls
        self.event_writers = list(event_writers)
        self.sync_workers = list(sync_workers)
        self.database_url = database_url
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.clients: list[ClusterClient] = []
        self.readers: list[SyncReader] = []
        self.probes: list[SyncReader] = []
        self.rooms: list[str] = []
        #: A room whose join rule is knock_restricted (knock on a release before it): churn knocks
        #: on it, and members of the room it allows (`allowing`, empty: none) join it vouched for.
        self.knock_room, self.allowing = "", list[str]()
        self.joined: dict[str, set[str]] = {}
        #: (user, room) -> the user's membership as the load last set it (UNKNOWN after a failure).
        self.membership: dict[tuple[str, str], str | None] = {}
        #: (room, receipt type, user) -> the event of the last receipt the user set there.
        self.receipts: dict[tuple[str, str, str], str] = {}
        #: (user, device) -> one-time key ids uploaded, and handed out by claims.
        self.keys_uploaded: dict[tuple[str, str], list[str]] = {}
        self.keys_claimed: dict[tuple[str, str], list[str]] = {}
        #: Devices a key upload or claim of unknown outcome touched (their count is not checked).
        self.keys_uncertain: set[tuple[str, str]] = set()
        #: user -> (room, event id) of the messages the user sent and has not redacted.
        self.messages: dict[str, list[tuple[str, str]]] = {}
        #: redacted event id -> (room, the redaction's event id).
        self.redactions: dict[str, tuple[str, str]] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.report = LoadReport()
        #: (recipient, device) -> the to-device messages sent to it in order: (id, acknowledged, sender).
        self.to_device: dict[tuple[str, str], list[tuple[str, bool, str]]] = {}
        self._sent = 0
        #: (event id, the worker it was sent through) of the messages whose worker the load chose.
        self.sends_via: list[tuple[str, str]] = []
        self.racer = MembershipRacer(database_url, self.rng)
        self._done, self._started, self._until = 0, time.monotonic(), False
        self._run_id = f"{int(time.time() * 1000) % 10**8:08d}{self.rng.randrange(10**4):04d}"

    def _client(self) -> ClusterClient:
        return ClusterClient(self.session, self.urls, self.event_writers)

    async def setup(self) -> None:
        """Register users and probes, start their readers at the current token, make and fill rooms."""
        plan = self.plan
        for i in range(plan.users):
            client = self._client()
            await client.register(
                f"@u{i}-{self._run_id}", via=self.event_writers[i % len(self.event_writers)]
            )
            self.clients.append(client)
            workers = self.sync_workers[i % 2 :] + self.sync_workers[: i % 2]
            switch_every = 1 if plan.hopping_readers and i % 2 == 1 else 3
            if i > 0 and i >= plan.users - plan.laggards:
                clock = LagClock(self._run_estimate, self.rng)
                self.readers.append(LaggardReader(client, workers, switch_every, clock, plan.start_over))
            else:
                pause = SLOW_READER_PAUSE_S if i % 4 == 3 else 0.0
                self.readers.append(SyncReader(client, workers, switch_every, pause, plan.start_over))
            self.joined[str(client.user_id)] = set()
            self.locks[str(client.user_id)] = asyncio.Lock()
        for worker in self.sync_workers:
            probe = self._client()
            await probe.register(f"@probe-{worker}-{self._run_id}")
            self.probes.append(SyncReader(probe, [worker], 1_000_000, start_over=plan.start_over))
        for reader in self.readers + self.probes:
            await reader.initial()
        owner = self.clients[0]
        for _ in range(plan.rooms):
            # Topic changes at power 0, so every member's state changes pass the room's power levels.
            room = await owner.create_room(
                "public", power_level_content_override={"events": {"m.room.topic": 0}}
            )
            self.rooms.append(room)
        self.allowing = self.rooms[:1]
        for rule in churn.knock_room_rules(self.allowing):
            try:  # a release before restricted joins (the upgrade check's first phase) refuses it
                rules = [{"type": "m.room.join_rules", "content": rule}]
                self.knock_room = await owner.create_room("invite", initial_state=rules)
                break
            except RequestRefused as e:
                if e.status != 400 or rule["join_rule"] == "knock":
                    raise
                self.allowing = []
        for room in (*self.rooms, self.knock_room):
            self._set(str(owner.user_id), room, "join")
        for reader in self.probes:
            await asyncio.gather(*(reader.client.membership(room, "join") for room in self.rooms))
        for client in self.clients[1:]:
            for room in self.rng.sample(self.rooms, min(plan.rooms_per_user, len(self.rooms))):
                await client.membership(room, "join")
                self._set(str(client.user_id), room, "join")

    def _set(self, user: str, room: str, membership: str | None) -> None:
        self.membership[(user, room)] = membership
        if membership == "join":
            self.joined[user].add(room)
        else:
            self.joined[user].discard(room)

    def _run_estimate(self) -> float | None:
        """The load's expected length (seconds) from its progress so far; None while unknown."""
        share = self._done / max(self.plan.actions, 1)
        if self._until or share < 0.05:
            return None
        return (time.monotonic() - self._started) / share

    def _via(self, client: ClusterClient) -> str | None:
        """A send's worker: any, at random (None: the client's load balancer picks)."""
        return None if client.balanced is not None else self.rng.choice(list(self.urls))

    def _next_action(self) -> tuple[str, ClusterClient]:
        client = self.rng.choice(self.clients)
        roll = self.rng.random()
        if roll < self.plan.race_share:
            return "race", client
        roll = (roll - self.plan.race_share) / (1 - self.plan.race_share)
        kinds = (
            (0.48, "message"), (0.50, "redact"), (0.54, "churn"), (0.58, "receipt"), (0.60, "keys_upload"),
            (0.62, "keys_claim"), (0.68, "state"), (0.74, "join"), (0.79, "leave"),
            (0.82, "typing"), (0.85, "presence"), (0.91, "account_data"), (0.97, "to_device"),
        )  # fmt: skip
        kind = next((k for bound, k in kinds if roll < bound), "device_keys")
        return kind, client

    async def _act(self, kind: str, client: ClusterClient) -> None:
        user = str(client.user_id)
        owner = client is self.clients[0]
        async with self.locks[user]:
            started = time.monotonic()
            mine = sorted(self.joined[user])
            others = sorted(set(self.rooms) - self.joined[user])
            room = ""
            try:
                if kind == "race" and not owner:
                    room = self.rng.choice(self.rooms)
                    state = self.membership.get((user, room))
                    if state == UNKNOWN:
                        return
                    self._set(user, room, UNKNOWN)  # until the race tells what was stored
                    written, after = await self.racer.race(self.clients[0], client, room, state)
                    self._set(user, room, UNKNOWN if after is None else after)
                    self.report.events_sent += written
                    self.report.membership_changes += written
                    return
                if kind == "churn" and not owner:
                    # A quarter in the knock room: knocks and restricted joins get their share.
                    room = self.knock_room if self.rng.random() < 0.25 else self.rng.choice(self.rooms)
                    await self._churn(client, room)
                    return
                if kind == "join" and others:
                    room = self.rng.choice(others)
                    was = self.membership.get((user, room))
                    await client.membership(room, "join")
                    self._set(user, room, "join")
                    if was == UNKNOWN:  # after a fault it may have been stored: a repeat stores nothing
                        return
                elif kind == "leave" and len(mine) > 1 and not owner:
                    room = self.rng.choice(mine)
                    await client.membership(room, "leave")
                    self._set(user, room, "leave")
                elif kind == "state" and mine:
                    await client.set_state(
                        self.rng.choice(mine), "m.room.topic", "", {"topic": f"t{time.time()}"}
                    )
                elif kind == "typing" and mine:
                    await client.typing(self.rng.choice(mine), self.rng.random() < 0.7)
                    self.report.typing_sent += 1
                    return
                elif kind == "presence":
                    await client.set_presence(self.rng.choice(["online", "unavailable"]), f"s{time.time()}")
                    self.report.presence_sent += 1
                    return
                elif kind in ("account_data", "to_device", "device_keys"):
                    await self._stored_write(kind, client)
                    return
                elif kind in ("receipt", "keys_upload", "keys_claim"):
                    await self._client_chore(kind, client, mine)
                    return
                elif kind == "redact" and self.messages.get(user):
                    room, target = self.messages[user].pop()
                    self.redactions[target] = (room, await client.redact(room, target, "load"))
                elif mine:
                    room, via = self.rng.choice(mine), self._via(client)
                    sent = await client.send(
                        room, "m.room.message", {"body": f"hello {time.time()}"}, via=via
                    )
                    self.messages.setdefault(user, []).append((room, str(sent["event_id"])))
                    if via is not None:
                        self.sends_via.append((str(sent["event_id"]), via))
                else:
                    return
            except RequestRefused as e:
                if e.status == 403:
                    self.report.rejected += 1
                    return
                if e.status < 500:
                    raise
                self.report.failed += 1
                self._failure(kind, f"{e.status} {e.errcode}: {e.body}")
                self.report.internal_errors += e.status == 500
                if room:
                    self._set(user, room, UNKNOWN)
                return
            except (aiohttp.ClientError, TimeoutError) as e:
                # The persister is down or restarting: the outcome is unknown, the database decides.
                self.report.failed += 1
                self._failure(kind, f"{type(e).__name__}: {e}")
                if room:
                    self._set(user, room, UNKNOWN)
                return
            finally:
                if kind in ROOM_WRITES:
                    took_ms = (time.monotonic() - started) * 1000
                    self.report.longest_write_ms = max(self.report.longest_write_ms, took_ms)
        self.report.events_sent += 1

    def _failure(self, kind: str, how: str) -> None:
        if len(self.report.failures) < 20:
            self.report.failures.append(f"{kind}: {how}"[:300])

    async def _client_chore(self, kind: str, client: ClusterClient, mine: list[str]) -> None:
        """What clients do every minute besides sending: a receipt on the last event the user's
        reader saw in one of its rooms (private one time in five), an upload of three one-time
        keys, a claim of one of another user's device's keys. An outcome that is unknown (a fault)
        takes the device's key count out of the check."""
        user, device = str(client.user_id), str(client.device_id)
        if kind == "receipt":
            latest = self.readers[self.clients.index(client)].latest
            room = self.rng.choice(mine) if mine else None
            if room is None or room not in latest:
                return
            receipt_type = "m.read.private" if self.rng.random() < 0.2 else "m.read"
            event_id = latest[room]  # the reader moves it on meanwhile
            key = (room, receipt_type, user)
            try:
                await client.receipt(room, event_id, receipt_type)
            except BaseException:
                self.receipts[key] = UNKNOWN  # a fault: it may have been set all the same
                raise
            self.receipts[key] = event_id
            self.report.receipts_sent += 1
        elif kind == "keys_upload":
            self._sent += 1
            keys = {f"signed_curve25519:{self._run_id}.{self._sent}.{i}": {"key": f"k{i}"} for i in range(3)}
            try:
                await client.upload_one_time_keys(keys)
            except BaseException:
                self.keys_uncertain.add((user, device))  # for good: a later success settles nothing
                raise
            self.keys_uploaded.setdefault((user, device), []).extend(k.partition(":")[2] for k in keys)
            self.report.keys_uploaded += len(keys)
        else:
            owners = [k for k, v in self.keys_uploaded.items() if v and k[0] != user]
            if not owners:
                return
            owner = self.rng.choice(owners)
            try:
                handed = await client.claim_key(*owner)
            except BaseException:
                self.keys_uncertain.add(owner)  # it may have handed a key out all the same
                raise
            self.keys_claimed.setdefault(owner, []).extend(k.partition(":")[2] for k in handed)
            self.report.keys_claimed += len(handed)

    async def _churn(self, client: ClusterClient, room: str) -> None:
        """Two to four membership changes of `client` in `room` back to back, each one the room's
        owner or the user may make from the membership before it. A refused change (another
        action raced it) ends the churn; a failed one leaves the membership unknown until a later
        join sets it. Each change is counted as it is stored, so the changes before a refusal
        count, and no tally is held across an await (other actors count meanwhile)."""
        user, owner = str(client.user_id), self.clients[0]
        for _ in range(self.rng.randint(2, 4)):
            state = self.membership.get((user, room))
            if state == UNKNOWN:
                break
            vouched = any(self.membership.get((user, allowing)) == "join" for allowing in self.allowing)
            who, what = self.rng.choice(churn.moves(state, room == self.knock_room, vouched))
            if who == "me":
                await client.membership(room, what)
            else:
                await owner.membership(room, "leave" if what == "kick" else what, target=user)
            self._set(user, room, "leave" if what in ("kick", "unban") else what)
            self.report.events_sent += 1
            self.report.membership_changes += 1

    async def _stored_write(self, kind: str, client: ClusterClient) -> None:
        """One write of a stored stream; every one is unique (a new account-data type, a new message
        id, new key material), so the check can tell each apart."""
        self._sent += 1
        unique = f"{self._run_id}.{self._sent}"
        if kind == "account_data":
            await client.put_account_data(f"io.fanout.load.{unique}", {"n": self._sent})
            self.report.account_data_sent += 1
        elif kind == "device_keys":
            device = str(client.device_id)
            await client.upload_keys({"algorithms": ["m.olm.v1.curve25519-aes-sha2"],
                                      "keys": {f"ed25519:{device}": f"key-{unique}"}})  # fmt: skip
            self.report.device_changes_sent += 1
        else:
            peer = self.rng.choice([c for c in self.clients if c is not client])
            target = (str(peer.user_id), str(peer.device_id))
            sent = self.to_device.setdefault(target, [])
            sender = str(client.user_id)
            sent.append((unique, False, sender))
            device = self.rng.choice([target[1], "*"])
            await client.send_to_device("io.fanout.load", {target[0]: {device: {"msg": unique}}})
            sent[sent.index((unique, False, sender))] = (unique, True, sender)
            self.report.to_device_sent += 1

    async def run(self, progress: Progress | None = None, until: asyncio.Event | None = None) -> LoadReport:
        """Drive the plan's actions (or, given `until`, actions until it is set), then wait until
        every reader is caught up with every writer, and check what they saw."""
        plan = self.plan
        stop = asyncio.Event()
        target: dict[str, dict[str, int]] = {}
        instance_ids: dict[str, int] = {}

        def caught_up(token: str) -> bool:
            return bool(target) and covers(token, target, instance_ids)

        readers = [
            asyncio.create_task(r.run(stop, caught_up, plan.sync_timeout_ms))
            for r in self.readers + self.probes
        ]
        try:
            await self._readers_read_the_setup(readers)
        except BaseException:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            await self.racer.close()
            raise
        queue: asyncio.Queue[tuple[str, ClusterClient]] = asyncio.Queue()
        for _ in range(plan.actions if until is None else 0):
            queue.put_nowait(self._next_action())
        started = self._started = time.monotonic()
        cpu_started = time.process_time()
        self._until = until is not None
        done = 0

        async def actor() -> None:
            nonlocal done
            while not (queue.empty() if until is None else until.is_set()):
                kind, client = queue.get_nowait() if until is None else self._next_action()
                await self._act(kind, client)
                done = self._done = done + 1
                if progress is not None:
                    elapsed = time.monotonic() - started
                    progress(
                        done, plan.actions, f"{self.report.events_sent / max(elapsed, 1e-9):,.0f} events/s"
                    )

        try:
            await asyncio.gather(*(actor() for _ in range(plan.concurrency)))
            self.report.seconds = time.monotonic() - started
            self.report.client_cpu_s = time.process_time() - cpu_started
            self.report.actions = done
            async with connect(self.database_url) as conn:
                final, ids = await written_positions(conn)
                writer_of = await conn.fetch(
                    "SELECT event_id, instance_name FROM events WHERE event_id = ANY($1::text[])",
                    [e for e, _ in self.sends_via],
                )
            self.report.mix.count_routes(
                self.sends_via, {r["event_id"]: r["instance_name"] for r in writer_of}, self.event_writers
            )
            instance_ids.update(ids)
            target.update(final)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*readers), 120)
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            await self.racer.close()
        await verify_load(self, instance_ids)
        self.report.problems += self.racer.check()
        self.report.problems += self.report.mix.count_readers(self.readers, self.racer.tally)
        return self.report

    async def _readers_read_the_setup(self, readers: Sequence[asyncio.Task[None]]) -> None:
        """Wait until every reader but the laggards holds a token past everything the setup wrote
        (at most `SETUP_READ_S`): their first answers carry every room's creation and joins, and
        clients are online before the load, as users are. Otherwise the load's first messages
        wait behind those answers, and the latency figures measure the setup's catch-up."""
        async with connect(self.database_url) as conn:
            setup, instance_ids = await written_positions(conn)
        following = [r for r in self.readers + self.probes if not isinstance(r, LaggardReader)]
        deadline = time.monotonic() + SETUP_READ_S
        while time.monotonic() < deadline and not all(
            r.token is not None and covers(r.token, setup, instance_ids) for r in following
        ):
            for task in readers:
                if task.done():
                    task.result()  # a reader that failed already: say why now
            await asyncio.sleep(0.02)


#: The longest the load waits for the readers to read what the setup wrote.
SETUP_READ_S = 30.0
#: The pause of every fourth reader before each sync.
SLOW_READER_PAUSE_S = 0.5
UNKNOWN = "?"
#: The load's actions that write into a room (timed for `LoadReport.longest_write_ms`).
ROOM_WRITES = frozenset({"message", "redact", "churn", "race", "state", "join", "leave"})
