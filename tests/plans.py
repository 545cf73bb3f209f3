"""The plan PostgreSQL keeps for a prepared statement, for tests that a lookup reads its indexes.

asyncpg prepares each statement once per connection, and PostgreSQL may keep a generic plan of
it: one made on the tables as they were (small and never analysed, in a new database) and kept as
they grow. `generic_plan` prepares the statement under `plan_cache_mode = force_generic_plan` and
returns that plan's text.
"""

from __future__ import annotations

from typing import Any


def literal(value: object) -> str:
    """A statement's argument (a text, an integer, or a list of them) as an SQL literal."""
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(map(literal, value)) + "]"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


async def generic_plan(conn: Any, query: str, args: tuple[object, ...]) -> str:
    """`EXPLAIN` of `query` with `args`, as the generic plan a connection would keep."""
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    await conn.execute(f"PREPARE kept AS {query}")
    try:
        rows = await conn.fetch(f"EXPLAIN EXECUTE kept({', '.join(map(literal, args))})")
        return "\n".join(r[0] for r in rows)
    finally:
        await conn.execute("DEALLOCATE kept")
        await conn.execute("RESET plan_cache_mode")
