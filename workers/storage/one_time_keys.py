"""One-time and fallback keys of local devices: stored on upload, handed out on claim.

A one-time key is handed out once: a claim deletes its row in the statement that picks it, and
rows another claim holds locked are skipped, so two claims running at once on any workers never
get the same key. A device keeps one fallback key per algorithm; a claim that finds no one-time key
of the algorithm gets the fallback key and marks it used (it stays, for the next such claim).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import asyncpg

from workers.storage import Conn

#: The algorithm clients count on seeing, even at 0 (Synapse answers it always: some clients read
#: a missing count as "unknown" and never upload).
DEFAULT_ALGORITHM = "signed_curve25519"


@dataclass(frozen=True, slots=True)
class UploadedKey:
    """One key of an upload: `algorithm:key_id` -> the key as canonical JSON text."""

    algorithm: str
    key_id: str
    key_json: str

    @property
    def name(self) -> str:
        return f"{self.algorithm}:{self.key_id}"


@dataclass(frozen=True, slots=True)
class ClaimedKey:
    user_id: str
    device_id: str
    key: UploadedKey


class KeyConflict(Exception):
    """An upload names a one-time key id the device holds with other content."""


async def add_one_time_keys(
    conn: Conn, user_id: str, device_id: str, keys: Sequence[UploadedKey], now_ms: int
) -> None:
    """Store `keys` (inside the caller's transaction): a key the device holds with the same content
    is kept as is; with other content, KeyConflict (the caller rolls back). The device must exist
    (asyncpg.ForeignKeyViolationError otherwise)."""
    if not keys:
        return
    algorithms, key_ids = [k.algorithm for k in keys], [k.key_id for k in keys]
    texts = [k.key_json for k in keys]
    held = await conn.fetch(
        "SELECT k.algorithm, k.key_id, k.key_json FROM e2e_one_time_keys k"
        " JOIN unnest($3::text[], $4::text[]) AS u(a, i) ON k.algorithm = u.a AND k.key_id = u.i"
        " WHERE k.user_id = $1 AND k.device_id = $2",
        user_id, device_id, algorithms, key_ids,
    )  # fmt: skip
    uploaded = {(k.algorithm, k.key_id): k.key_json for k in keys}
    for r in held:
        if uploaded[(r["algorithm"], r["key_id"])] != r["key_json"]:
            raise KeyConflict(
                f"one-time key {r['algorithm']}:{r['key_id']} already exists with other content"
            )
    await conn.execute(
        "INSERT INTO e2e_one_time_keys (user_id, device_id, algorithm, key_id, key_json, added_ts)"
        " SELECT $1, $2, a, i, j, $6 FROM unnest($3::text[], $4::text[], $5::text[]) AS u(a, i, j)"
        " ON CONFLICT DO NOTHING",
        user_id, device_id, algorithms, key_ids, texts, now_ms,
    )  # fmt: skip


async def set_fallback_keys(conn: Conn, user_id: str, device_id: str, keys: Sequence[UploadedKey]) -> None:
    """Make `keys` the device's fallback keys (one per algorithm: a later one of an algorithm
    wins). A key uploaded again as it is stored keeps its used flag; a new one starts unused."""
    latest = {k.algorithm: k for k in keys}
    if not latest:
        return
    await conn.execute(
        "INSERT INTO e2e_fallback_keys (user_id, device_id, algorithm, key_id, key_json, used)"
        " SELECT $1, $2, a, i, j, false FROM unnest($3::text[], $4::text[], $5::text[]) AS u(a, i, j)"
        " ON CONFLICT (user_id, device_id, algorithm) DO UPDATE SET key_id = EXCLUDED.key_id,"
        " key_json = EXCLUDED.key_json, used = e2e_fallback_keys.used"
        " AND e2e_fallback_keys.key_id = EXCLUDED.key_id AND e2e_fallback_keys.key_json = EXCLUDED.key_json",
        user_id, device_id, list(latest), [k.key_id for k in latest.values()],
        [k.key_json for k in latest.values()],
    )  # fmt: skip


#: (user, device) -> (one-time keys left per algorithm, the unused fallback keys' algorithms).
KeyCountsOf = dict[tuple[str, str], tuple[dict[str, int], list[str]]]


async def key_counts(conn: Conn, user_id: str, device_id: str) -> tuple[dict[str, int], list[str]]:
    """(one-time keys left per algorithm, with `DEFAULT_ALGORITHM` at least; the algorithms of the
    device's unused fallback keys, sorted): what `/keys/upload` and `/sync` tell the device."""
    return (await key_counts_of(conn, [(user_id, device_id)]))[(user_id, device_id)]


def key_counts_sql(first: int) -> str:
    """The CTEs `wanted` (the devices: user ids in `$first`, device ids in `$first + 1`) and
    `counted` (user_id, device_id, algorithm, n: n one-time keys left, or -1 for an unused
    fallback key), for `key_counts_of` and a statement that reads the counts beside something
    else (`workers.storage.events.events_with_key_counts`).

    Each device's keys are read through the primary key's index, a LATERAL subquery per device
    (the aggregate, and the fallback keys' `OFFSET 0`, keep PostgreSQL from making it a hash join
    over the whole table, as a plan made while the table was small did:
    `workers.storage.events._each_event`)."""
    return (
        f"wanted AS (SELECT * FROM unnest(${first}::text[], ${first + 1}::text[]) AS w(user_id, device_id)),"
        " counted AS (SELECT w.user_id, w.device_id, k.algorithm, k.n FROM wanted w, LATERAL"
        " (SELECT algorithm, count(*)::int AS n FROM e2e_one_time_keys"
        " WHERE user_id = w.user_id AND device_id = w.device_id GROUP BY algorithm) k"
        " UNION ALL SELECT w.user_id, w.device_id, f.algorithm, -1 FROM wanted w, LATERAL"
        " (SELECT algorithm FROM e2e_fallback_keys"
        " WHERE user_id = w.user_id AND device_id = w.device_id AND NOT used OFFSET 0) f)"
    )


def fold_key_counts(
    devices: Sequence[tuple[str, str]], counted: Iterable[tuple[str, str, str, int]]
) -> KeyCountsOf:
    """`key_counts_of`'s answer from the rows of `counted` (see `key_counts_sql`)."""
    out: KeyCountsOf = {device: ({DEFAULT_ALGORITHM: 0}, []) for device in devices}
    for user_id, device_id, algorithm, n in counted:
        counts, fallback = out[(user_id, device_id)]
        if n < 0:
            fallback.append(algorithm)
        else:
            counts[algorithm] = n
    for _, fallback in out.values():
        fallback.sort()
    return out


async def key_counts_of(conn: Conn, devices: Sequence[tuple[str, str]]) -> KeyCountsOf:
    """`key_counts` of several (user, device) pairs in one statement; every pair has an entry."""
    records = await conn.fetch(
        f"WITH {key_counts_sql(1)} SELECT user_id, device_id, algorithm, n FROM counted",
        [u for u, _ in devices],
        [d for _, d in devices],
    )
    return fold_key_counts(devices, records)


async def claim_keys(conn: Conn, wanted: Sequence[tuple[str, str, str]]) -> list[ClaimedKey]:
    """Hand out one key per (user, device, algorithm) of `wanted` that has one: a one-time key
    (deleted as it is picked; keys another claim holds are skipped), else the unused or used
    fallback key (marked used). Each one-time key is handed out once, whoever claims at once.

    The keys are picked in a MATERIALIZED CTE, run once. Picked inside the DELETE's join, the pick
    may run again for every key row the plan scans (a nested loop over the keys, as the planner
    chooses from statistics of a nearly empty table), each run skipping the rows the runs before
    locked: one claim then deleted every key of the device."""
    if not wanted:
        return []
    users, devices, algorithms = (list(column) for column in zip(*wanted, strict=True))
    records = await conn.fetch(
        "WITH picked AS MATERIALIZED (SELECT p.* FROM unnest($1::text[], $2::text[], $3::text[])"
        " AS w(u, d, a) CROSS JOIN LATERAL (SELECT user_id, device_id, algorithm, key_id"
        " FROM e2e_one_time_keys WHERE user_id = w.u AND device_id = w.d AND algorithm = w.a"
        " ORDER BY key_id LIMIT 1 FOR UPDATE SKIP LOCKED) p)"
        " DELETE FROM e2e_one_time_keys k USING picked"
        " WHERE k.user_id = picked.user_id AND k.device_id = picked.device_id"
        " AND k.algorithm = picked.algorithm AND k.key_id = picked.key_id"
        " RETURNING k.user_id, k.device_id, k.algorithm, k.key_id, k.key_json",
        users, devices, algorithms,
    )  # fmt: skip
    claimed = [_claimed(r) for r in records]
    got = {(c.user_id, c.device_id, c.key.algorithm) for c in claimed}
    rest = [w for w in wanted if w not in got]
    if rest:
        users, devices, algorithms = (list(column) for column in zip(*rest, strict=True))
        records = await conn.fetch(
            "UPDATE e2e_fallback_keys f SET used = true FROM unnest($1::text[], $2::text[], $3::text[])"
            " AS w(u, d, a) WHERE f.user_id = w.u AND f.device_id = w.d AND f.algorithm = w.a"
            " RETURNING f.user_id, f.device_id, f.algorithm, f.key_id, f.key_json",
            users, devices, algorithms,
        )  # fmt: skip
        claimed += [_claimed(r) for r in records]
    return claimed


def _claimed(r: asyncpg.Record) -> ClaimedKey:
    return ClaimedKey(r["user_id"], r["device_id"], UploadedKey(r["algorithm"], r["key_id"], r["key_json"]))
