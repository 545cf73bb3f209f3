"""The check at the end of a load (`LoadDriver.run`): every reader's recorded /sync answers against
the events and stored streams' tables and what the driver sent (`workers.harness.history` holds
the rules), the redactions as every sync worker serves them, receipts and one-time keys, every
room's stored events against the Matrix authorization rules (`workers.harness.auth_rules`), and the
persist-to-visible latency of the probes, into the load's `LoadReport`; and, for a check that
failed, `keep_for_diagnosis` (what it judged, written beside the workers' logs). Harness only: a
worker never imports it.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from workers.harness.auth_replay import replay_database
from workers.harness.cluster_client import ClusterClient, RequestRefused
from workers.harness.history import (
    StoredChange,
    StoredEvent,
    check_history,
    check_one_time_keys,
    check_receipts,
    check_stored_streams,
)
from workers.harness.load_mix import LoadMix
from workers.harness.sync_reader import SyncReader
from workers.model import CURRENT_STATE_CACHE
from workers.storage import Conn, connect


class _Plan(Protocol):
    @property
    def expect_ephemeral(self) -> bool: ...


class CheckedLoad(Protocol):
    """What the check reads of the load that ran (`workers.harness.loadgen.LoadDriver`): what was
    sent, the readers' recorded answers, and the report it fills in."""

    @property
    def database_url(self) -> str: ...
    @property
    def plan(self) -> _Plan: ...
    @property
    def report(self) -> LoadReport: ...
    @property
    def clients(self) -> list[ClusterClient]: ...
    @property
    def sync_workers(self) -> list[str]: ...
    @property
    def readers(self) -> list[SyncReader]: ...
    @property
    def probes(self) -> list[SyncReader]: ...
    @property
    def rooms(self) -> list[str]: ...
    @property
    def to_device(self) -> dict[tuple[str, str], list[tuple[str, bool, str]]]: ...
    @property
    def redactions(self) -> dict[str, tuple[str, str]]: ...
    @property
    def receipts(self) -> dict[tuple[str, str, str], str]: ...
    @property
    def keys_uploaded(self) -> dict[tuple[str, str], list[str]]: ...
    @property
    def keys_claimed(self) -> dict[tuple[str, str], list[str]]: ...
    @property
    def keys_uncertain(self) -> set[tuple[str, str]]: ...


@dataclass
class LoadReport:
    actions: int = 0
    events_sent: int = 0
    rejected: int = 0
    failed: int = 0
    #: Answers with status 500 (writes and syncs): a fault must be answered 503, never 500.
    internal_errors: int = 0
    #: The longest a room write (send, state, membership, redaction) took to be answered.
    longest_write_ms: float = 0.0
    #: The first failed actions: kind and how each failed.
    failures: list[str] = field(default_factory=list)
    membership_changes: int = 0
    redactions_sent: int = 0
    receipts_sent: int = 0
    receipts_seen: int = 0
    keys_uploaded: int = 0
    keys_claimed: int = 0
    #: Sync answers that listed a room under `leave` and under `invite` or `knock` at once.
    left_and_pending_seen: int = 0
    pending_seen: int = 0
    seconds: float = 0.0
    #: CPU the load's own process (its clients and readers) used over `seconds`.
    client_cpu_s: float = 0.0
    syncs: int = 0
    latency_ms: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    invalidation_rows: int = 0
    per_key_invalidations: int = 0
    events_checked: int = 0
    typing_sent: int = 0
    presence_sent: int = 0
    typing_seen: int = 0
    presence_seen: int = 0
    account_data_sent: int = 0
    to_device_sent: int = 0
    device_changes_sent: int = 0
    account_data_seen: int = 0
    to_device_seen: int = 0
    device_changes_seen: int = 0
    #: Racing membership pairs, worker switches, laggards, limited timelines, wrong persisters.
    mix: LoadMix = field(default_factory=LoadMix)
    #: Stored live events replayed through the Matrix authorization rules, and those they refuse.
    auth_events_replayed: int = 0
    auth_violations: int = 0

    @property
    def events_per_s(self) -> float:
        return self.events_sent / self.seconds if self.seconds else 0.0

    @property
    def actions_per_s(self) -> float:
        return self.actions / self.seconds if self.seconds else 0.0

    @property
    def client_cores(self) -> float:
        """Cores the load's clients used: beside the machine's, whether they could bound the load."""
        return self.client_cpu_s / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latency_ms:
            return float("nan")
        if len(self.latency_ms) == 1:
            return self.latency_ms[0]
        return statistics.quantiles(self.latency_ms, n=100, method="inclusive")[int(q) - 1]

    def summary(self) -> dict[str, Any]:
        return {
            "actions": self.actions,
            "events_sent": self.events_sent,
            "rejected_by_rules": self.rejected,
            "failed_requests": self.failed,
            "internal_errors": self.internal_errors,
            "longest_write_ms": round(self.longest_write_ms, 1),
            "membership_changes": self.membership_changes,
            "redactions_sent": self.redactions_sent,
            "receipts_sent": self.receipts_sent,
            "receipts_seen": self.receipts_seen,
            "one_time_keys_uploaded": self.keys_uploaded,
            "one_time_keys_claimed": self.keys_claimed,
            "invites_and_knocks_seen": self.pending_seen,
            "left_and_pending_seen": self.left_and_pending_seen,
            "seconds": round(self.seconds, 2),
            "events_per_s": round(self.events_per_s, 1),
            "actions_per_s": round(self.actions_per_s, 1),
            "client_cores": round(self.client_cores, 3),
            "syncs": self.syncs,
            "latency_p50_ms": round(self.percentile(50), 1),
            "latency_p99_ms": round(self.percentile(99), 1),
            "latency_samples": len(self.latency_ms),
            "typing_updates_sent": self.typing_sent,
            "typing_notifications_seen": self.typing_seen,
            "presence_updates_sent": self.presence_sent,
            "presence_events_seen": self.presence_seen,
            "account_data_writes": self.account_data_sent,
            "account_data_seen": self.account_data_seen,
            "to_device_sent": self.to_device_sent,
            "to_device_seen": self.to_device_seen,
            "device_changes": self.device_changes_sent,
            "device_list_notices_seen": self.device_changes_seen,
            "auth_events_replayed": self.auth_events_replayed,
            "auth_violations": self.auth_violations,
            "invalidation_messages": self.invalidation_rows,
            "per_key_invalidation_messages": self.per_key_invalidations,
            **self.mix.summary(),
            "verified": not self.problems,
            "problems_found": len(self.problems),
            "problems": self.problems[:20],
        }


async def invalidation_counts(conn: Conn) -> tuple[int, int]:
    """(caches-stream messages of current-state changes, the invalidations they stand for, one per
    key and cache): a row covers each of its rooms' two caches plus each member's room list."""
    row = await conn.fetchrow(
        "SELECT count(*) AS rows, coalesce(sum(cardinality(keys)"
        " + (SELECT count(*) FROM unnest(keys) k WHERE k LIKE '!%')), 0) AS per_key"
        " FROM cache_invalidation_stream_by_instance WHERE cache_func = $1",
        CURRENT_STATE_CACHE,
    )
    assert row is not None
    return int(row["rows"]), int(row["per_key"])


#: The stored events the histories are checked against (`workers.harness.history.StoredEvent`).
_STORED_EVENTS = (
    "SELECT stream_ordering, instance_name, event_id, room_id, type, state_key,"
    " json::jsonb->'content'->>'membership' AS membership,"
    " json::jsonb->'content'->>'history_visibility' AS visibility"
    " FROM events ORDER BY stream_ordering"
)


async def verify_load(driver: CheckedLoad, instance_ids: dict[str, int]) -> None:
    """Check every reader's recorded history against the tables and what the driver sent; the
    problems, counts and latencies go into `driver.report`."""
    async with connect(driver.database_url) as conn:
        rows = await conn.fetch(_STORED_EVENTS)
        driver.report.invalidation_rows, driver.report.per_key_invalidations = await invalidation_counts(conn)
        changes = await conn.fetch(
            "SELECT 'account_data' AS stream, user_id, account_data_type AS key, stream_id, instance_name"
            " FROM account_data WHERE account_data_type LIKE 'io.fanout.load.%'"
            " UNION ALL SELECT 'device_lists', user_id, '', stream_id, instance_name"
            " FROM device_lists_stream"
        )
    stored = [StoredEvent(**dict(r)) for r in rows]
    stored_changes = [StoredChange(**dict(r)) for r in changes]
    for reader in driver.readers + driver.probes:
        driver.report.syncs += len(reader.records)
        user = str(reader.client.user_id)
        driver.report.problems += check_history(user, reader.records, stored, instance_ids)
        sent = driver.to_device.get((user, str(reader.client.device_id)), [])
        driver.report.problems += check_stored_streams(
            user, reader.records, stored_changes, sent, instance_ids
        )
        driver.report.account_data_seen += sum(len(r.account_data) for r in reader.records)
        driver.report.to_device_seen += sum(len(r.to_device) for r in reader.records)
        driver.report.device_changes_seen += sum(len(r.device_changed) for r in reader.records)
    driver.report.redactions_sent = len(driver.redactions)
    driver.report.problems += await _check_redactions(driver)
    # Every room of the load's database, in stream order, judged by the spec's rules (not ours).
    auth = await replay_database(driver.database_url)
    driver.report.auth_events_replayed, driver.report.auth_violations = auth.events, len(auth.violations)
    driver.report.problems += [f"stored against the auth rules: {v}" for v in auth.violations]
    for event_id, ts in (await _message_times(driver.database_url)).items():
        arrivals = [p.arrivals.get(event_id) for p in driver.probes]
        if all(a is not None for a in arrivals):
            driver.report.latency_ms.append(max(0.0, (max(a for a in arrivals if a) - ts / 1000) * 1000))
    readers = driver.readers + driver.probes
    driver.report.events_checked = sum(
        len({i for r in reader.records for i in r.delivered()}) for reader in readers
    )
    driver.report.typing_seen = sum(r.typing_seen for r in readers)
    driver.report.internal_errors += sum(r.internal_errors for r in readers)
    for reader in readers:
        user, device = str(reader.client.user_id), str(reader.client.device_id)
        watched = driver.rooms if reader in driver.probes else ()
        driver.report.problems += check_receipts(user, reader.records, driver.receipts, watched)
        driver.report.receipts_seen += sum(len(r.receipts) for r in reader.records)
        if (user, device) in driver.keys_uploaded and (user, device) not in driver.keys_uncertain:
            driver.report.problems += check_one_time_keys(
                user, reader.records, driver.keys_uploaded[(user, device)],
                driver.keys_claimed.get((user, device), []),
            )  # fmt: skip
    for record in (r for reader in readers for r in reader.records):
        pending = {room for section, room in record.sections or () if section in ("invite", "knock")}
        driver.report.pending_seen += len(pending)
        driver.report.left_and_pending_seen += sum(
            1 for section, room in record.sections or () if section == "leave" and room in pending
        )
    driver.report.presence_seen = sum(r.presence_seen for r in readers)
    if driver.plan.expect_ephemeral:
        # Ephemeral by nature (a typing start may be over before anyone syncs), so no exactly-once:
        # but what was sent must have reached someone.
        if driver.report.typing_sent and not driver.report.typing_seen:
            driver.report.problems.append(
                f"{driver.report.typing_sent} typing updates sent, none seen in /sync"
            )
        if driver.report.presence_sent and not driver.report.presence_seen:
            driver.report.problems.append(f"{driver.report.presence_sent} presence updates sent, none seen")


async def _check_redactions(driver: CheckedLoad) -> list[str]:
    """Every redacted message, read by the rooms' owner (joined throughout) through every sync
    worker, is pruned (no content left) and names its redaction in `unsigned.redacted_because`."""
    problems: list[str] = []
    owner = driver.clients[0]
    for target, (room, redaction) in sorted(driver.redactions.items()):
        answered = 0
        for worker in driver.sync_workers:
            try:
                event = await owner.event(room, target, via=worker)
            except RequestRefused as e:
                problems.append(f"redacted {target} could not be read on {worker}: {e}")
                continue
            except (aiohttp.ClientError, TimeoutError):
                continue  # a fault scenario took this worker away (or moved it): the others tell
            answered += 1
            because = event.get("unsigned", {}).get("redacted_because", {}).get("event_id")
            if event.get("content") != {} or because != redaction:
                problems.append(f"{worker} serves redacted {target} unpruned (or without its redaction)")
        if not answered:
            problems.append(f"redacted {target} could not be read on any sync worker")
    return problems


async def _message_times(database_url: str) -> dict[str, int]:
    """event_id -> received_ts (ms, set by the persister) of every live message."""
    async with connect(database_url) as conn:
        rows = await conn.fetch(
            "SELECT event_id, received_ts FROM events WHERE type = 'm.room.message' AND stream_ordering > 0"
        )
    return {r["event_id"]: r["received_ts"] for r in rows}


async def keep_for_diagnosis(driver: CheckedLoad, directory: Path, phase: str = "") -> list[Path]:
    """What a failed check judged, written into `directory` (`phase` names a load of several):
    every problem found, every reader's recorded syncs and the stored events they were checked
    against, read as `verify_load` reads them. The files written."""
    suffix = f" {phase}" if phase else ""
    problems, histories, events = (
        directory / f"{name}{suffix}.{ext}"
        for name, ext in (("problems", "txt"), ("histories", "json"), ("events", "json"))
    )
    problems.write_text("".join(f"{p}\n" for p in driver.report.problems))
    records = {
        str(r.client.user_id): [dataclasses.asdict(x) for x in r.records]
        for r in driver.readers + driver.probes
    }
    histories.write_text(json.dumps(records))
    async with connect(driver.database_url) as conn:
        events.write_text(json.dumps([dict(r) for r in await conn.fetch(_STORED_EVENTS)]))
    return [problems, histories, events]
