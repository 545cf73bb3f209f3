"""Storage: migrations and one module of SQL per domain. Functions take a connection, never a pool,
so the caller decides what runs in one transaction."""

from __future__ import annotations

from typing import Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

#: A plain connection or one borrowed from a pool.
Conn: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
