"""`fanout check-config` prints the resolved configuration without any URL's password;
`fanout --version` prints the installed package's version."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import yaml

from workers.process.redact import redact_url

FANOUT = str(Path(sys.executable).parent / "fanout")


def test_redact_url_hides_only_the_password() -> None:
    assert redact_url("postgresql://app:s3cr@t@db:5432/x") == "postgresql://app:***@db:5432/x"
    assert redact_url("redis://default:pw@[::1]:6379/0") == "redis://default:***@[::1]:6379/0"
    assert redact_url("redis://127.0.0.1:6379") == "redis://127.0.0.1:6379"
    assert redact_url("postgresql://app@db/x") == "postgresql://app@db/x"
    assert redact_url("not a url: a:b@c") == "not a url: a:b@c"


def test_check_config_prints_no_password(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "instance_name": "w1",
                "database_url": "postgresql://app:db-secret@127.0.0.1:5432/fanout",
                "redis_url": "redis://fanout:redis-secret@127.0.0.1:6379",
                "stream_writers": {"events": ["w1"]},
                "worker_secret": "worker-secret-0123456789",
            }
        )
    )
    result = subprocess.run(
        [FANOUT, "check-config", str(path)], capture_output=True, text=True, check=True, timeout=60
    )
    assert "db-secret" not in result.stdout and "redis-secret" not in result.stdout
    assert "worker-secret-0123456789" not in result.stdout
    printed = json.loads(result.stdout)
    assert printed["worker_secret"] == "***"
    assert printed["database_url"] == "postgresql://app:***@127.0.0.1:5432/fanout"
    assert printed["redis_url"] == "redis://fanout:***@127.0.0.1:6379"


def test_version_comes_from_the_package_metadata() -> None:
    result = subprocess.run([FANOUT, "--version"], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == f"fanout {importlib.metadata.version('fanout')}"


def _worker_yaml(name: str, **fields: object) -> str:
    return yaml.safe_dump(
        {
            "instance_name": name,
            "database_url": "postgresql://app@127.0.0.1:5432/fanout",
            "redis_url": "redis://127.0.0.1:6379",
            "stream_writers": {"events": ["p1"]},
            **fields,
        }
    )


def test_check_config_prints_a_directorys_connection_budget(tmp_path: Path) -> None:
    (tmp_path / "p1.yaml").write_text(_worker_yaml("p1", db_pool_size=8))
    (tmp_path / "sync.yaml").write_text(_worker_yaml("sync-{hostname}", db_pool_size=4))
    (tmp_path / "notes.txt").write_text("not a configuration")
    command = [FANOUT, "check-config", str(tmp_path), "--replicas", "sync=3", "--audit-partitions", "4"]
    result = subprocess.run([*command, "--max-connections", "40"], capture_output=True, text=True, timeout=60)
    # (8 + 1) + 3 x (4 + 1) + 4 partitions + 5 headroom = 33
    assert result.returncode == 0, result.stderr
    assert "sync.yaml: 3 x (db_pool_size 4 + lease 1) = 15" in result.stdout
    assert "total: 33" in result.stdout and "fits max_connections=40 (7 to spare)" in result.stdout
    over = subprocess.run([*command, "--max-connections", "32"], capture_output=True, text=True, timeout=60)
    assert over.returncode == 2 and over.stderr.splitlines() == [
        "fanout: the budget (33) exceeds max_connections=32: lower db_pool_size or raise max_connections"
    ]
    (tmp_path / "bad.yaml").write_text(_worker_yaml("bad", redis_url="redis://127.0.0.1:99999"))
    bad = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
    assert "bad.yaml" in bad.stderr and "port '99999'" in bad.stderr
    alone = subprocess.run(
        [FANOUT, "check-config", str(tmp_path / "bad.yaml")], capture_output=True, text=True, timeout=60
    )
    assert (alone.returncode, alone.stdout) == (2, "")
    assert alone.stderr.splitlines() == [
        f"fanout: invalid configuration in {tmp_path / 'bad.yaml'}: field 'redis_url': Value error,"
        " malformed URL: port '99999' is not a number in 1-65535"
    ]


def test_pools_through_pgbouncer_count_against_its_pool_not_max_connections(tmp_path: Path) -> None:
    (tmp_path / "p1.yaml").write_text(_worker_yaml("p1", db_pool_size=8))
    pooled = {"database_pooler": "transaction", "database_direct_url": "postgresql://app@db:5432/fanout"}
    (tmp_path / "sync.yaml").write_text(_worker_yaml("sync-{hostname}", db_pool_size=10, **pooled))
    command = [FANOUT, "check-config", str(tmp_path), "--replicas", "sync=6", "--pgbouncer-pool", "12"]
    result = subprocess.run(
        [*command, "--max-connections", "40", "--max-client-conn", "100"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # PostgreSQL: (8 + 1) + 6 leases + PgBouncer's 12 + 5 headroom = 32; PgBouncer: 6 x 10 = 60 clients
    assert result.returncode == 0, result.stderr
    assert (
        "sync.yaml: 6 x lease 1 = 6 (its pools, 6 x db_pool_size 10 = 60, go to PgBouncer)" in result.stdout
    )
    assert "PgBouncer server pool (default_pool_size + reserve_pool_size): 12" in result.stdout
    assert "total: 32 (needs max_connections >= 32)" in result.stdout
    assert "PgBouncer clients: 60 (needs max_client_conn >= 60)" in result.stdout
    assert "fits max_connections=40 (8 to spare)" in result.stdout
    assert "fits PgBouncer's max_client_conn=100 (40 to spare)" in result.stdout
    over = subprocess.run([*command, "--max-client-conn", "50"], capture_output=True, text=True, timeout=60)
    assert over.returncode == 2 and over.stderr.splitlines() == [
        "fanout: the pools through PgBouncer (60) exceed max_client_conn=50: lower db_pool_size or raise"
        " PgBouncer's max_client_conn"
    ]
