"""The Spark session the audit runs in, and the JDBC driver it reads Postgres with."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from analytics.errors import AuditError

DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
JDBC_JAR_ENV = "FANOUT_JDBC_JAR"
EXIT_OK, EXIT_GAP, EXIT_USAGE = 0, 1, 2


def resolve_jdbc_jar(explicit: str | None) -> str:
    """The JDBC jar path: `explicit`, else $FANOUT_JDBC_JAR, else Debian's; AuditError if it is missing."""
    path = explicit or os.environ.get(JDBC_JAR_ENV) or DEFAULT_JDBC_JAR
    if not Path(path).is_file():
        raise AuditError(
            f"Postgres JDBC driver not found at {path}: apt-get install -y libpostgresql-jdbc-java, "
            f"or pass --jdbc-jar / set {JDBC_JAR_ENV}"
        )
    return path


def spark_session(
    master: str = "local[*]",
    jdbc_jar: str | None = None,
    conf: Sequence[tuple[str, str]] = (),
    app_name: str = "fanout-audit",
) -> tuple[SparkSession, bool]:
    """(session, owned): the active session if there is one (owned False: do not stop it), else a new one.

    The jar goes in `spark.jars` (a local file), so Spark never resolves anything from Ivy/Maven.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if jdbc_jar is not None:
        builder = builder.config("spark.jars", jdbc_jar)
    for key, value in conf:
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session, True
