"""The Spark session the audit runs in, and the JDBC driver it reads Postgres with."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from analytics.errors import AuditError

#: Spark's own log lines at ERROR and above (the defaults print WARN lines about the platform).
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
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
    master: str | None = None,
    jdbc_jar: str | None = None,
    conf: Sequence[tuple[str, str]] = (),
    app_name: str = "fanout-audit",
) -> tuple[SparkSession, bool]:
    """(session, owned): the active session if there is one (owned False: do not stop it), else a new one.

    The master is `master` when given, else the one spark-submit set (`--master`), else `local[*]`.
    The jar goes in `spark.jars` (a local file), so Spark never resolves anything from Ivy/Maven. A
    local run binds to loopback (SPARK_LOCAL_IP, unless set) and logs through the package's quiet
    log4j configuration, so a clean run prints no warning of Spark's own.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    # Under spark-submit the JVM started this Python (and holds `--master` and the Java options);
    # it says so with the gateway's port. Otherwise we start the JVM and choose for it.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is None and not submitted:
        master = "local[*]"
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if LOG4J_CONFIG.is_file() and not submitted:
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"
        )
    builder = builder.config("spark.sql.session.timeZone", "UTC").config(
        "spark.ui.showConsoleProgress", "false"
    )
    if jdbc_jar is not None:
        builder = builder.config("spark.jars", jdbc_jar)
    for key, value in conf:
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session, True
