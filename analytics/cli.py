"""`fanout audit [run|export] ...` (also `python -m analytics` and the spark-submit entry `audit.py`).

Exit 0: no gap; 1: a worker missed invalidations; 2: bad usage or configuration; 3: the database
could not be reached (analytics/errors.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import sys

from analytics.errors import EXIT_GAP, EXIT_OK, EXIT_USAGE, AuditError
from analytics.job import AuditOptions, release, run_audit
from analytics.locations import local_path
from analytics.report import write_outputs
from analytics.session import DEFAULT_JDBC_JAR, JDBC_JAR_ENV, resolve_jdbc_jar, spark_session
from analytics.sources import ParquetSource, PostgresSource, Source, check_export_days, export, jdbc_url

_DURATION = re.compile(r"^(\d+)(ms|s|m|h)?$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_window(text: str) -> int:
    """'60s', '1m', '5m', '1h', '250ms' or bare milliseconds -> milliseconds (> 0)."""
    match = _DURATION.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"bad window {text!r}: want e.g. 60s, 1m, 5m, 1h")
    return int(match.group(1)) * _UNIT_MS[match.group(2) or "ms"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"want a positive integer, got {text!r}")
    return value


def _quantile(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"want a quantile in (0, 1), got {text!r}")
    return value


def conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"want KEY=VALUE, got {text!r}")
    return key, value


def _day(text: str) -> str:
    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a day as YYYY-MM-DD, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fanout audit",
        description="Invalidation audit on Spark. "
        "Exit 0: no gap; 1: a worker missed invalidations; 2: bad usage or configuration;"
        " 3: the database could not be reached.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--database-url", default=os.environ.get("FANOUT_DATABASE_URL"),
                       help="postgresql://user@host:port/db (default $FANOUT_DATABASE_URL)")  # fmt: skip
        p.add_argument(
            "--jdbc-jar", help=f"Postgres JDBC jar (default ${JDBC_JAR_ENV} or {DEFAULT_JDBC_JAR})"
        )
        p.add_argument("--master", help="any Spark master (default: spark-submit's --master, else local[*])")
        p.add_argument("--num-partitions", type=_positive_int, help="JDBC read partitions on stream_id")
        p.add_argument("--lower-bound", type=int, help="JDBC partition lower bound (default: table min)")
        p.add_argument("--upper-bound", type=int, help="JDBC partition upper bound (default: table max)")
        p.add_argument("--spark-conf", type=conf_pair, action="append", default=[], metavar="KEY=VALUE")

    run = sub.add_parser("run", help="compute the audit (default)")
    common(run)
    run.add_argument("--parquet", help="read what `fanout audit export` wrote there (a path or a URI)")
    run.add_argument(
        "--out",
        default="audit-report",
        help="output path or URI (file://, hdfs://, s3a://; default ./audit-report)",
    )
    run.add_argument("--window", type=parse_window, default=60_000, help="window length (default 1m)")
    run.add_argument("--storm-threshold", type=float, help="rows per window above which it is a storm")
    run.add_argument("--storm-quantile", type=_quantile, default=0.99, help="used without --storm-threshold")
    run.add_argument("--top-n", type=_positive_int, default=10)
    run.add_argument(
        "--subscribers", type=int, help="workers subscribed to caches (default: from the record)"
    )

    exp = sub.add_parser("export", help="write the tables as Parquet for later runs")
    common(exp)
    exp.add_argument("--out", required=True, help="output path or URI (file://, hdfs://, s3a://)")
    exp.add_argument("--since", type=_day, help="export only the UTC days from YYYY-MM-DD on (incremental)")
    exp.add_argument(
        "--after-restore",
        action="store_true",
        help="the database was restored from a backup taken on --since's day: first drop every exported"
        " day from --since on (rows the restored database lost), then write those days again",
    )
    return parser


def _postgres_source(args: argparse.Namespace) -> PostgresSource:
    if not args.database_url:
        raise AuditError("no source: pass --database-url (or set FANOUT_DATABASE_URL) or --parquet DIR")
    jdbc_url(args.database_url)
    return PostgresSource(
        database_url=args.database_url,
        jdbc_jar=resolve_jdbc_jar(args.jdbc_jar),
        num_partitions=args.num_partitions,
        lower_bound=args.lower_bound,
        upper_bound=args.upper_bound,
    )


def main(argv: list[str]) -> int:
    """`fanout audit [run|export] ...`; see `build_parser`. Exit codes: analytics/errors.py."""
    argv = list(argv)
    if not argv or argv[0] not in ("run", "export", "-h", "--help"):
        argv = ["run", *argv]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed one usage message; return its status instead of exiting
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    progress = logging.getLogger("analytics")
    handler: logging.Handler | None = None
    if not progress.handlers:  # the job's steps on stderr, whoever configured the root logger
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("audit: %(message)s"))
        progress.addHandler(handler)
        progress.setLevel(logging.INFO)
        progress.propagate = False
    try:
        return _run(args)
    finally:
        if handler is not None:
            progress.removeHandler(handler)


def _run(args: argparse.Namespace) -> int:
    try:
        source: Source
        if args.command == "run" and args.parquet is not None:
            local = local_path(args.parquet)
            if local is not None and not (local / "invalidations").is_dir():
                raise AuditError(
                    f"{args.parquet} has no invalidations/ (write it with `fanout audit export`)"
                )
            source = ParquetSource(args.parquet)
            jar = None
        else:
            source = _postgres_source(args)
            jar = source.jdbc_jar
            if args.command == "export":
                check_export_days(args.since, args.after_restore)
        spark, owned = spark_session(args.master, jar, args.spark_conf)
        logging.getLogger("analytics.audit").info("step=session master=%s", spark.sparkContext.master)
        try:
            if args.command == "export":
                assert isinstance(source, PostgresSource)
                written = export(spark, source, args.out, args.since, args.after_restore)
                print(json.dumps({"out": args.out, "rows": written}))
                return EXIT_OK
            options = AuditOptions(
                window_ms=args.window,
                storm_threshold=args.storm_threshold,
                storm_quantile=args.storm_quantile,
                top_n=args.top_n,
                subscribers=args.subscribers,
            )
            result = run_audit(spark, source, options)
            paths = write_outputs(result, args.out)
            release(result)
        finally:
            if owned:
                spark.stop()
    except AuditError as e:
        print(f"fanout audit: {e}", file=sys.stderr)
        return e.exit_code
    recon = result.summary["reconciliation"]
    print(f"report: {paths.report}")
    print(f"summary: {paths.summary}")
    if not recon["ok"]:
        for gap in recon["gaps"]:
            print(
                f"GAP worker={gap['worker_name']} run={gap['run_id']} writer={gap['instance_name']} "
                f"stream_ids=({gap['hole_from']},{gap['hole_to']}] missed_rows={gap['missed_rows']}",
                file=sys.stderr,
            )
        return EXIT_GAP
    return EXIT_OK
