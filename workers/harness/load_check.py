"""The check at the end of a load (`LoadDriver.run`): every reader's recorded /sync answers against
the events and stored streams' tables and what the driver sent (`workers.harness.history` holds
the rules), the redactions as every sync worker serves them, receipts and one-time keys, and the
persist-to-visible latency of the probes. Harness only: a worker never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp

from workers.harness.cluster_client import RequestRefused
from workers.harness.history import (
    StoredChange,
    StoredEvent,
    check_history,
    check_one_time_keys,
    check_receipts,
    check_stored_streams,
)
from workers.model import CURRENT_STATE_CACHE
from workers.storage import Conn, connect

if TYPE_CHECKING:
    from workers.harness.loadgen import LoadDriver


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


async def verify_load(driver: LoadDriver, instance_ids: dict[str, int]) -> None:
    """Check every reader's recorded history against the tables and what the driver sent; the
    problems, counts and latencies go into `driver.report`."""
    async with connect(driver.database_url) as conn:
        rows = await conn.fetch(
            "SELECT stream_ordering, instance_name, event_id, room_id, type, state_key,"
            " json::jsonb->'content'->>'membership' AS membership,"
            " json::jsonb->'content'->>'history_visibility' AS visibility"
            " FROM events ORDER BY stream_ordering"
        )
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
    for event_id, ts in (await _message_times(driver.database_url)).items():
        arrivals = [p.arrivals.get(event_id) for p in driver.probes]
        if all(a is not None for a in arrivals):
            driver.report.latency_ms.append(max(0.0, (max(a for a in arrivals if a) - ts / 1000) * 1000))
    readers = driver.readers + driver.probes
    driver.report.events_checked = sum(
        len({i for r in reader.records for i in r.event_ids}) for reader in readers
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


async def _check_redactions(driver: LoadDriver) -> list[str]:
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
