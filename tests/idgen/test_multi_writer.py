"""MultiWriterIdGenerator against real Postgres: each numbered semantic of issue 3 has a test here."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from idgen import (
    InconsistentSequenceError,
    MultiWriterIdGenerator,
    MultiWriterStreamToken,
    NotAWriterError,
    Probe,
)
from idgen.multi_writer import probe_lookup_sql
from tests.plans import generic_plan

EVENTS = [("events", "instance_name", "stream_ordering")]
Make = Callable[..., Awaitable[MultiWriterIdGenerator]]


@pytest.fixture
async def make(db_pool: asyncpg.Pool) -> AsyncIterator[Make]:
    """Build generators for the `events` stream (overridable), closed at teardown."""
    made: list[MultiWriterIdGenerator] = []

    async def factory(instance: str, writers: list[str], **kw: Any) -> MultiWriterIdGenerator:
        pool = kw.pop("pool", db_pool)
        opts: dict[str, Any] = {
            "stream_name": "events",
            "tables": EVENTS,
            "sequence_name": "events_stream_seq",
        }
        opts.update(kw)
        gen = await MultiWriterIdGenerator.create(pool, instance_name=instance, writers=writers, **opts)
        made.append(gen)
        return gen

    yield factory
    for gen in made:
        await gen.close()


async def stored_positions(pool: asyncpg.Pool, stream: str = "events") -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = $1", stream
    )
    return {r["instance_name"]: r["stream_id"] for r in rows}


async def write(gen: MultiWriterIdGenerator, n: int = 1) -> list[int]:
    ids = []
    for _ in range(n):
        async with gen.get_next() as i:
            ids.append(i)
    return ids


async def test_the_known_bound_follows_own_allocations_and_sequence_reads(make: Make) -> None:
    """`known_allocated_token` is a lower bound of the sequence without I/O: raised by this
    process's allocations and its reads of the sequence, never by what other writers claim."""
    a = await make("a", ["a", "b"])
    b = await make("b", ["a", "b"])
    reader = await make("r", ["a", "b"])
    assert a.known_allocated_token() == 0
    assert await write(a, 3) == [1, 2, 3]
    assert a.known_allocated_token() == 3
    assert await write(b, 2) == [4, 5]
    a.advance("b", 900)  # a claim heard on the channel proves nothing about the sequence
    assert a.known_allocated_token() == 3
    assert reader.known_allocated_token() == 0
    assert await reader.get_max_allocated_token() == 5
    assert reader.known_allocated_token() == 5
    assert await a.get_max_allocated_token() == 5  # on the writer's kept connection
    assert a.known_allocated_token() == 5


async def test_a_delayed_position_rides_on_the_next_allocation_or_its_timer(
    make: Make, db_pool: asyncpg.Pool
) -> None:
    """`position_delay_s`: the block returns before `stream_positions` holds its IDs; the next
    allocation's own statement upserts the position reached before it, the timer the last one, and
    `close()` one still waiting."""
    gen = await make("a", ["a"], position_delay_s=0.2)
    assert await stored_positions(db_pool) == {"a": 0}
    assert await write(gen, 1) == [1]
    assert await stored_positions(db_pool) == {"a": 0}  # not waited for
    async with gen.get_next() as second:  # carries 1 in the nextval statement
        assert second == 2
        assert await stored_positions(db_pool) == {"a": 1}
    await asyncio.sleep(0.4)
    assert await stored_positions(db_pool) == {"a": 2}  # the timer, the writer being idle
    assert await write(gen, 2) == [3, 4]
    await gen.close()
    assert await stored_positions(db_pool) == {"a": 4}


async def test_a_probe_takes_ids_only_for_values_not_stored(make: Make, db_pool: asyncpg.Pool) -> None:
    """`get_next_mult(n, probe=...)`: the values found in the column take no ID, in the same
    statement as the allocation (also when it carries a delayed position upsert)."""
    for delay in (0.0, 0.5):
        gen = await make(f"a{delay}", [f"a{delay}"], position_delay_s=delay)
        async with gen.get_next_mult(2) as first:
            for i in first:
                await db_pool.execute(
                    "INSERT INTO events VALUES ($1, $2, 'a', '!r', 'm', NULL, '@u', '{}', 0)", i, f"$s{i}"
                )
        stored = [f"$s{i}" for i in first]
        probe = Probe("events", "event_id", [stored[1], "$new", stored[0]])
        allocation = gen.get_next_mult(4, probe=probe)
        async with allocation as ids:
            assert ids == [first[-1] + 1, first[-1] + 2]
        assert allocation.found == frozenset(stored)
        every = gen.get_next_mult(2, probe=Probe("events", "event_id", stored))
        async with every as none:
            assert none == []
        assert every.found == frozenset(stored)
        assert await write(gen) == [first[-1] + 3]
        with pytest.raises(ValueError):
            gen.get_next_mult(1, probe=Probe("events", "event_id", ["$x", "$y"]))


async def test_a_probes_lookup_reads_the_unique_index_under_any_plan(db_pool: asyncpg.Pool) -> None:
    """asyncpg keeps a prepared statement, and PostgreSQL keeps its generic plan: one made while
    the table is small and never analysed must still read the unique index (a sequential scan
    there costs a scan of the whole table per allocation as the table grows). Each value found is
    returned once, however often it is asked for."""
    await db_pool.execute("INSERT INTO events VALUES (1, '$a', 'a', '!r', 'm', NULL, '@u', '{}', 0)")
    sql = probe_lookup_sql(Probe("events", "event_id", ["$a"]), 1)
    async with db_pool.acquire() as conn:
        plan = await generic_plan(conn, sql, (["$a", "$a", "$b"],))
        found = await conn.fetch(sql, ["$a", "$a", "$b"])
    assert "Seq Scan on events" not in plan and "events_event_id_key" in plan, plan
    assert [r["v"] for r in found] == ["$a"]


#: A host statement for rides: an `events` row per element of $1.
_HOST = (
    "INSERT INTO events SELECT i, '$h' || i, 'a', '!r', 'm', NULL, '@u', '{}', 0"
    " FROM unnest($1::bigint[]) AS i"
)


async def test_a_ride_allocates_in_the_callers_statement(make: Make, db_pool: asyncpg.Pool) -> None:
    """`ride_mult(n)`: the IDs come back with the host statement's row count, from one statement
    on the caller's connection (the probe and a delayed position upsert in it too), and are in
    flight until the ride's block exits, as `get_next_mult`'s are."""
    for delay in (0.0, 0.5):
        gen = await make(f"a{delay}", [f"a{delay}"], position_delay_s=delay)
        async with gen.get_next_mult(2) as first:
            await db_pool.execute(_HOST, first)
        stored = [f"$h{i}" for i in first]
        ride = gen.ride_mult(4, probe=Probe("events", "event_id", [stored[1], "$new", stored[0]]))
        async with db_pool.acquire() as conn:
            assert await ride.carry(conn, _HOST, ([-7, -8, -9],)) == 3
        assert ride.carried and ride.found == frozenset(stored)
        async with ride as ids:
            assert ids == [first[-1] + 1, first[-1] + 2]
            assert gen.get_current_token() == first[-1]  # in flight: held below them
        assert gen.get_current_token() == ids[-1]
        if delay:
            assert (await stored_positions(db_pool))[f"a{delay}"] == first[-1]  # carried in the statement
        assert await write(gen) == [ids[-1] + 1]
        await db_pool.execute("DELETE FROM events WHERE stream_ordering < 0")
        with pytest.raises(ValueError):
            gen.ride_mult(1, probe=Probe("events", "event_id", ["$x", "$y"]))


async def test_a_ride_whose_statement_fails_takes_nothing_and_a_discarded_one_finishes(
    make: Make, db_pool: asyncpg.Pool
) -> None:
    gen = await make("a", ["a"])
    assert await write(gen) == [1]
    await db_pool.execute(_HOST, [1])
    failed = gen.ride_mult(2)
    async with db_pool.acquire() as conn:
        with pytest.raises(asyncpg.UniqueViolationError):
            await failed.carry(conn, _HOST, ([1],))  # the host's row exists: the statement fails
    assert not failed.carried
    with pytest.raises(RuntimeError):
        async with failed:
            pass
    await failed.discard()  # nothing to finish
    assert not gen._book.busy
    unused = gen.ride_mult(2)
    async with db_pool.acquire() as conn:
        assert await unused.carry(conn, _HOST, ([],)) == 0
    assert gen.get_current_token() == 1  # its IDs (above the failed ride's gaps) are in flight
    await unused.discard()
    top = await db_pool.fetchval("SELECT last_value FROM events_stream_seq")
    assert gen.get_current_token() == top >= 3
    assert await write(gen) == [top + 1]


async def test_first_id_is_1_and_an_empty_stream_is_at_0(make: Make, db_pool: asyncpg.Pool) -> None:
    gen = await make("a", ["a"])
    assert gen.get_current_token() == 0
    assert await gen.get_max_allocated_token() == 0
    async with gen.get_next() as stream_id:
        assert stream_id == 1
        assert await gen.get_max_allocated_token() == 1
        assert gen.get_current_token() == 0
    # Finished before the block returned: another connection sees it right away.
    assert await stored_positions(db_pool) == {"a": 1}
    assert gen.get_current_token() == 1
    async with gen.get_next_mult(3) as ids:
        assert ids == [2, 3, 4]
    assert gen.get_current_token() == 4
    assert await stored_positions(db_pool) == {"a": 4}


async def test_get_next_is_one_round_trip_plus_one_upsert(database_url: str, make: Make) -> None:
    queries: list[str] = []

    async def init(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda q: queries.append(q.query))

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4, init=init)
    try:
        gen = await make("a", ["a"], pool=pool)
        await write(gen)
        await asyncio.sleep(0.05)
        queries.clear()
        await write(gen)
        async with gen.get_next_mult(5):
            pass
        await asyncio.sleep(0.05)  # query loggers are called soon after, not during, the query
        assert len(queries) == 4, queries
        assert sum("nextval" in q and "generate_series" not in q for q in queries) == 1
        assert sum("nextval" in q and "generate_series" in q for q in queries) == 1
        assert sum(q.startswith("INSERT INTO stream_positions") for q in queries) == 2
        await gen.close()
    finally:
        await pool.close()


async def test_out_of_order_finish(make: Make, db_pool: asyncpg.Pool) -> None:
    gen = await make("a", ["a"])
    assert await write(gen, 6) == [1, 2, 3, 4, 5, 6]
    blocks = [gen.get_next() for _ in range(3)]
    assert [await b.__aenter__() for b in blocks] == [7, 8, 9]
    await blocks[2].__aexit__(None, None, None)
    await blocks[1].__aexit__(None, None, None)
    assert gen.get_current_token() == 6
    assert gen.get_current_token_for_writer("a") == 6
    assert gen.get_minimal_local_current_token() == 6
    assert await stored_positions(db_pool) == {"a": 6}
    await blocks[0].__aexit__(None, None, None)
    assert gen.get_current_token() == 9
    assert gen.get_minimal_local_current_token() == 9
    assert await stored_positions(db_pool) == {"a": 9}


async def test_on_finished_hears_each_finish_before_the_upsert(make: Make, db_pool: asyncpg.Pool) -> None:
    """Replication is told as soon as the IDs finish (Synapse's order), once per block, failed
    blocks too; `stream_positions` follows before the block returns."""
    gen = await make("a", ["a"])
    await write(gen)
    heard: list[int] = []
    gen.on_finished = lambda: heard.append(gen.get_current_token_for_writer("a"))
    async with gen.get_next_mult(3):
        assert heard == []
    assert heard == [4]  # the listener could announce the block's IDs
    with pytest.raises(RuntimeError):
        async with gen.get_next():
            raise RuntimeError("the write failed")
    assert heard == [4, 5]  # a failed write's ID is a finished gap, announced too
    assert await stored_positions(db_pool) == {"a": 5}


async def test_concurrent_writers_in_one_process_share_upserts(make: Make, db_pool: asyncpg.Pool) -> None:
    gen = await make("a", ["a"])

    async def one() -> int:
        async with gen.get_next() as i:
            await asyncio.sleep(0)
            return int(i)

    ids = await asyncio.gather(*(one() for _ in range(200)))
    assert sorted(ids) == list(range(1, 201))
    assert gen.get_current_token() == 200
    assert await stored_positions(db_pool) == {"a": 200}


async def test_interleaved_writers_idle_writer_follows(make: Make) -> None:
    a = await make("a", ["a", "b"])
    b = await make("b", ["a", "b"])
    reader = await make("r", ["a", "b"])
    for _ in range(3):
        for src, dst in ((a, b), (b, a)):
            (i,) = await write(src)
            dst.advance(src.instance_name, i)
            reader.advance(src.instance_name, i)
    assert a.get_current_token() == b.get_current_token() == 6
    assert reader.get_current_token() == 5  # a wrote 5 last and has not announced that it is idle
    reader.advance("a", a.get_current_token_for_writer("a"))
    assert reader.get_current_token() == 6
    # b goes idle; a keeps writing. a advances alone (its IDs are consecutive) ...
    await write(a, 4)
    assert a.get_current_token() == 10
    b.advance("a", 10)
    reader.advance("a", 10)
    assert reader.get_current_token() == 6  # b has not said it is idle yet
    # ... and b, idle, counts as being at the highest ID it knows of, which it announces.
    assert b.get_current_token_for_writer("b") == 10
    assert b.get_minimal_local_current_token() == 6
    reader.advance("b", b.get_current_token_for_writer("b"))
    assert reader.get_current_token() == 10
    assert reader.get_positions() == {"a": 10, "b": 10}


async def test_own_in_flight_id_holds_back_linear_position(make: Make) -> None:
    a = await make("a", ["a", "b"])
    b = await make("b", ["a", "b"])
    block = a.get_next()
    held = await block.__aenter__()
    (later,) = await write(b)
    a.advance("b", later)
    assert a.get_current_token() == held - 1
    await block.__aexit__(None, None, None)
    assert a.get_current_token() == later


async def test_unheard_writer_holds_back_linear_only(make: Make, db_pool: asyncpg.Pool) -> None:
    a = await make("a", ["a", "b", "c"])
    b = await make("b", ["a", "b", "c"])
    reader = await make("r", ["a", "b", "c"])
    for gen in (a, b):
        await write(gen)
        reader.advance(gen.instance_name, gen.get_current_token_for_writer(gen.instance_name))
    assert reader.get_positions() == {"a": 1, "b": 2}
    assert reader.get_current_token() == 0  # c never heard from: it may be writing
    assert reader.get_current_token_for_writer("c") == 0
    token = MultiWriterStreamToken.from_generator(reader)
    assert token.get_stream_pos_for_instance("b") == 2  # the vector clock is not held back
    c = await make("c", ["a", "b", "c"])  # c starts: at the sequence's max, announced
    reader.advance("c", c.get_current_token_for_writer("c"))
    assert reader.get_current_token() == 1  # a's own position is still 1
    reader.advance("a", 2)
    assert reader.get_current_token() == 2


async def test_restart_while_another_writer_has_an_id_in_flight(database_url: str, make: Make) -> None:
    pools = [await asyncpg.create_pool(database_url, min_size=1, max_size=3) for _ in range(4)]
    try:
        a = await make("a", ["a", "b"], pool=pools[0])
        b = await make("b", ["a", "b"], pool=pools[1])
        await write(a, 9)
        block = a.get_next()
        assert await block.__aenter__() == 10
        assert await write(b, 2) == [11, 12]
        fresh = await make("r", ["a", "b"], pool=pools[2])
        assert fresh.get_current_token() == 9
        assert fresh.get_positions() == {"a": 9, "b": 12}
        restarted_b = await make("b", ["a", "b"], pool=pools[2])
        assert restarted_b.get_current_token() == 9
        assert restarted_b.get_current_token_for_writer("b") == 12
        await block.__aexit__(None, None, None)
        later = await make("r2", ["a", "b"], pool=pools[3])
        assert later.get_current_token() == 10
        fresh.advance("a", 10)
        assert fresh.get_current_token() == 10
    finally:
        for pool in pools:
            await pool.close()


async def test_startup_reads_positions_not_a_million_rows(database_url: str, make: Make) -> None:
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(
            "CREATE TABLE big (stream_id BIGINT PRIMARY KEY, instance_name TEXT NOT NULL);"
            "CREATE SEQUENCE big_seq;"
            "INSERT INTO big SELECT g, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END"
            " FROM generate_series(1, 1000000) g;"
            "SELECT setval('big_seq', 1000000);"
            "ANALYZE big;"
            # b's position is stale: Synapse would read every row above it at start-up.
            "INSERT INTO stream_positions VALUES ('big', 'a', 1000000), ('big', 'b', 5);"
        )
        logged: list[tuple[str, Any]] = []

        async def init(conn: asyncpg.Connection) -> None:
            conn.add_query_logger(lambda q: logged.append((q.query, q.args)))

        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2, init=init)
        try:
            gen = await make(
                "a",
                ["a", "b"],
                pool=pool,
                stream_name="big",
                tables=[("big", "instance_name", "stream_id")],
                sequence_name="big_seq",
            )
            assert gen.get_current_token() == 5
            assert gen.get_current_token_for_writer("a") == 1_000_000
        finally:
            await pool.close()
        touching = [(q, args) for q, args in logged if "big" in q.replace("big_seq", "")]
        assert touching, logged
        for query, args in touching:
            plan = json.loads(await admin.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + query, *(args or ())))
            for node in _plan_nodes(plan[0]["Plan"]):
                if node.get("Relation Name") == "big":
                    assert node["Node Type"] != "Seq Scan", (query, node)
                    assert node["Actual Rows"] <= 1, (query, node)
    finally:
        await admin.close()


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    out = [node]
    for child in node.get("Plans", []):
        out.extend(_plan_nodes(child))
    return out


async def test_new_and_returning_writers_start_at_persisted_upto(make: Make, db_pool: asyncpg.Pool) -> None:
    old = await make("old", ["a", "old"])
    await write(old, 2)
    await old.close()
    a = await make("a", ["a"])  # "old" removed from the writers: its row is forgotten
    assert "old" not in await stored_positions(db_pool)
    await write(a, 3)
    assert a.get_current_token() == 5
    reader = await make("r", ["a", "old", "new"])  # both come back / appear
    assert reader.get_current_token() == 5
    assert reader.get_current_token_for_writer("old") == 5
    assert reader.get_current_token_for_writer("new") == 5
    new = await make("new", ["a", "old", "new"])
    assert new.get_current_token() == 5
    assert new.get_current_token_for_writer("new") == 5
    assert await write(new) == [6]


async def test_several_tables_repair_the_sequence(
    database_url: str, make: Make, db_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    await db_pool.execute(
        "CREATE SEQUENCE acc_seq;"
        "CREATE TABLE acc_room (instance_name TEXT, stream_id BIGINT);"
        "CREATE INDEX ON acc_room (stream_id);"
        "CREATE TABLE acc_tags (instance_name TEXT, stream_id BIGINT);"
        "CREATE INDEX ON acc_tags (stream_id);"
        "CREATE TABLE acc_global (instance_name TEXT, stream_id BIGINT);"
        "CREATE INDEX ON acc_global (stream_id);"
        "INSERT INTO acc_room VALUES ('a', 7); INSERT INTO acc_tags VALUES ('a', 50);"
        "SELECT setval('acc_seq', 10);"
        "INSERT INTO stream_positions VALUES ('account_data', 'a', 40);"
    )
    tables = [(t, "instance_name", "stream_id") for t in ("acc_room", "acc_tags", "acc_global")]
    opts: dict[str, Any] = {"stream_name": "account_data", "tables": tables, "sequence_name": "acc_seq"}
    with caplog.at_level(logging.WARNING, logger="idgen.multi_writer"):
        gen = await make("a", ["a"], **opts)
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "acc_seq" in warning and "acc_tags" in warning and "acc_room" not in warning
    # The positions row (40) is checked against the repaired sequence (50), so start-up succeeds.
    assert await gen.get_max_allocated_token() == 50
    assert await write(gen) == [51]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="idgen.multi_writer"):
        await make("b", ["a", "b"], **opts)
    assert not caplog.records


async def test_positions_ahead_of_the_sequence_refuse_to_start(make: Make, db_pool: asyncpg.Pool) -> None:
    await db_pool.execute("INSERT INTO stream_positions VALUES ('events', 'a', 100)")
    with pytest.raises(InconsistentSequenceError) as err:
        await make("a", ["a"])
    message = str(err.value)
    assert "'events'" in message and "events_stream_seq" in message
    assert "setval" in message and "DELETE FROM stream_positions" in message


async def test_negative_stream(make: Make, db_pool: asyncpg.Pool) -> None:
    opts: dict[str, Any] = {
        "positive": False,
        "stream_name": "backfill",
        "sequence_name": "events_backfill_stream_seq",
    }
    gen = await make("a", ["a", "b"], **opts)
    assert gen.get_current_token() == 0
    ids = []
    for n in range(3):
        async with gen.get_next() as i:
            ids.append(i)
            await db_pool.execute(
                "INSERT INTO events VALUES ($1, $2, 'a', '!r', 'm', NULL, '@u', '{}', 0)", i, f"$e{n}"
            )
    async with gen.get_next_mult(2) as more:
        ids.extend(more)
    assert ids == [-1, -2, -3, -4, -5]
    assert gen.get_current_token_for_writer("a") == -5
    assert gen.get_current_token() == -5  # b never heard from, but a's IDs are consecutive
    assert await gen.get_max_allocated_token() == -5
    assert (await stored_positions(db_pool, "backfill"))["a"] == -5
    # A lower (more negative) row than the sequence knows: the MIN is what must be found.
    await db_pool.execute("INSERT INTO events VALUES (-9, '$x', 'a', '!r', 'm', NULL, '@u', '{}', 0)")
    await db_pool.execute("INSERT INTO stream_positions VALUES ('backfill', 'b', -4)")
    restarted = await make("r", ["a", "b"], **opts)
    assert await restarted.get_max_allocated_token() == -9
    assert restarted.get_positions() == {"a": -5, "b": -4}
    assert restarted.get_current_token() == -4
    restarted.advance("b", -5)
    assert restarted.get_current_token() == -5
    assert await write(gen) == [-10]
    await db_pool.execute("UPDATE stream_positions SET stream_id = -20 WHERE stream_name = 'backfill'")
    with pytest.raises(InconsistentSequenceError):
        await make("r2", ["a", "b"], **opts)


async def test_non_writer_cannot_allocate(make: Make) -> None:
    reader = await make("r", ["a"])
    with pytest.raises(NotAWriterError, match="not a writer"):
        async with reader.get_next():
            pass
    reader.advance("a", 3)
    assert reader.get_current_token() == 3


#: The caches stream's generator: no `stream_positions` rows of its own.
CACHES_STREAM: dict[str, Any] = {
    "stream_name": "caches",
    "tables": [("cache_invalidation_stream_by_instance", "instance_name", "stream_id")],
    "sequence_name": "cache_invalidation_stream_seq",
    "track_positions_table": False,
}


async def test_untracked_stream_never_touches_stream_positions(make: Make, db_pool: asyncpg.Pool) -> None:
    await db_pool.execute(
        "INSERT INTO cache_invalidation_stream_by_instance VALUES (4, 'x', 'f', NULL, 0);"
        "SELECT setval('cache_invalidation_stream_seq', 4)"
    )
    gen = await make("a", [], **CACHES_STREAM)
    assert gen.get_current_token() == 4
    assert await write(gen, 2) == [5, 6]
    assert gen.get_current_token() == 6
    assert await db_pool.fetchval("SELECT count(*) FROM stream_positions") == 0
    with pytest.raises(ValueError, match="track_positions_table=False"):
        await make("a", [], **{**CACHES_STREAM, "track_positions_table": True})


async def test_untracked_stream_starts_at_a_restores_mark(make: Make, db_pool: asyncpg.Pool) -> None:
    """After a restore the table's highest ID is the dump's, behind the tokens clients hold: the
    procedure's row in `stream_positions` (at the moved sequence) is where the stream starts, never
    past the sequence."""
    await db_pool.execute(
        "INSERT INTO cache_invalidation_stream_by_instance VALUES (4, 'x', 'f', NULL, 0);"
        "SELECT setval('cache_invalidation_stream_seq', 1004);"
        "INSERT INTO stream_positions VALUES ('caches', 'restore', 1004)"
    )
    gen = await make("a", [], **CACHES_STREAM)
    assert gen.get_current_token() == 1004
    assert await write(gen) == [1005]
    await db_pool.execute(
        "INSERT INTO cache_invalidation_stream_by_instance VALUES (1005, 'a', 'f', NULL, 0)"
    )
    assert (await make("r", [], **CACHES_STREAM)).get_current_token() == 1005  # the table's, above the mark
    await db_pool.execute("UPDATE stream_positions SET stream_id = 2000")
    with pytest.raises(InconsistentSequenceError):
        await make("r2", [], **CACHES_STREAM)


async def test_failed_and_cancelled_writes_finish_their_ids(make: Make, db_pool: asyncpg.Pool) -> None:
    gen = await make("a", ["a"])
    with pytest.raises(RuntimeError):
        async with gen.get_next() as i:
            assert i == 1
            raise RuntimeError("the write failed")
    assert gen.get_current_token() == 1
    entered = asyncio.Event()

    async def stuck() -> None:
        async with gen.get_next():
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(stuck())
    await entered.wait()
    assert gen.get_current_token() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gen.get_current_token() == 2
    assert await stored_positions(db_pool) == {"a": 2}
    assert await write(gen) == [3]
