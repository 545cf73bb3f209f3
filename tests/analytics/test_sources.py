"""Reading the log: each way a database can be wrong gives one line naming the cause, the password
hidden, and its exit code (2: change the configuration; 3: the database could not be reached)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from pyspark.sql import SparkSession

import analytics
from analytics.sources import redact
from tests.conftest import Servers
from workers.embedded.services import free_port

SECRET = "s3cr3t-pw"


async def _admin(servers: Servers, *statements: str) -> str:
    """Run `statements` as the superuser; the path of pg_hba.conf."""
    conn = await asyncpg.connect(servers.admin_url)
    try:
        for statement in statements:
            await conn.execute(statement)
        return str(await conn.fetchval("SHOW hba_file"))
    finally:
        await conn.close()


@pytest.fixture
def password_role(servers: Servers) -> Iterator[str]:
    """A role that must log in with a password over TCP: a pg_hba line for it alone, removed after."""
    role = f"audit_{uuid.uuid4().hex[:8]}"
    line = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
    hba = Path(asyncio.run(_admin(servers, "SET password_encryption = 'scram-sha-256'",
                                  f"CREATE ROLE {role} LOGIN PASSWORD '{SECRET}'")))  # fmt: skip
    hba.write_text(line + hba.read_text())
    asyncio.run(_admin(servers, "SELECT pg_reload_conf()"))
    try:
        yield role
    finally:
        hba.write_text(hba.read_text().replace(line, ""))
        asyncio.run(_admin(servers, "SELECT pg_reload_conf()", f"DROP ROLE IF EXISTS {role}"))


def _run(url: str, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = analytics.main(["run", "--database-url", url, "--out", str(out)])
    return code, capsys.readouterr().err


def test_closed_port_is_unreachable_exit_3(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    code, err = _run(f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/x", tmp_path, capsys)
    assert code == 3
    assert f"connection refused at 127.0.0.1:{port}" in err
    assert SECRET not in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_missing_database_exit_2(
    spark: SparkSession, servers: Servers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = servers.database_url("no_such_database_here")
    code, err = _run(url, tmp_path, capsys)
    assert code == 2
    assert 'database "no_such_database_here" does not exist' in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_wrong_password_exit_2_and_the_password_is_hidden(
    spark: SparkSession,
    servers: Servers,
    password_role: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = servers.admin_url.split("@", 1)[1]
    code, err = _run(f"postgresql://{password_role}:wrong-{SECRET}@{base}", tmp_path, capsys)
    assert code == 2
    assert f'authentication failed for user "{password_role}"' in err
    assert SECRET not in err and ":***@" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_redact_hides_only_the_password() -> None:
    assert redact("postgresql://u:pw@h:5/db?x=1") == "postgresql://u:***@h:5/db?x=1"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
