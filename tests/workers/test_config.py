from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workers.config import ConfigError, load_config

GOOD = """
instance_name: persister1
database_url: postgresql://postgres@127.0.0.1:5432/fanout
redis_url: redis://127.0.0.1:6379/0
stream_writers:
  events: [persister1, persister2]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "worker.yaml"
    path.write_text(text)
    return path


def test_good_file_and_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FANOUT_CHANNEL_PREFIX", "prod")
    config = load_config(_write(tmp_path, GOOD))
    assert config.instance_name == "persister1"
    assert config.channel_prefix == "prod"
    assert config.writers_of("events") == ["persister1", "persister2"]
    assert config.writes("events") and config.writes("caches")  # the events writers, unless listed
    assert config.position_announce_interval_s == 1.0


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        (GOOD.replace("persister1, persister2", "persister1, persister1"), "stream_writers", "twice"),
        (GOOD + "position_announce_interval_s: -1\n", "position_announce_interval_s", "greater than 0"),
        (GOOD + "http_port: eighty\n", "http_port", "integer"),
        (GOOD + "colour: blue\n", "colour", "unknown field"),
        (GOOD.replace("redis://", "http://"), "redis_url", "redis://"),
        (GOOD.replace("6379/0", "99999/0"), "redis_url", "port '99999' is not a number in 1-65535"),
        (GOOD.replace("6379/0", "0/0"), "redis_url", "port '0' is not a number in 1-65535"),
        (GOOD.replace("6379/0", "6379/zero"), "redis_url", "is not a database number"),
        (GOOD.replace(":5432/", ":65536/"), "database_url", "port '65536' is not a number in 1-65535"),
        (GOOD + "instance_map: {p1: 'http://:8080'}\n", "instance_map", "names no host"),
        (GOOD + "instance_map: {p1: 'http://h:123456'}\n", "instance_map", "not a number in 1-65535"),
        (GOOD + "remote_servers: {remote: 'http://h:0'}\n", "remote_servers", "not a number in 1-65535"),
        (GOOD + "serve_reads: false\nread_workers: [sync1]\n", "(top level)", "no URL in instance_map"),
        (GOOD.replace("instance_name: persister1", "instance_name: 'two words'"), "instance_name", "letters"),
        ("\n".join(GOOD.splitlines()[2:]), "instance_name", "Field required"),
        (GOOD + "database_pooler: session\n", "database_pooler", "'none' or 'transaction'"),
        (GOOD + "database_pooler: transaction\n", "(top level)", "needs database_direct_url"),
        (
            GOOD + "database_direct_url: postgresql://postgres@db:5432/fanout\n",
            "(top level)",
            "used only with",
        ),
        (
            GOOD
            + "database_pooler: transaction\ndatabase_direct_url: postgresql://postgres@127.0.0.1:5432/fanout\n",
            "(top level)",
            "database_direct_url equals database_url",
        ),
        (
            GOOD + "database_pooler: transaction\ndatabase_direct_url: http://db\n",
            "database_direct_url",
            "postgresql",
        ),
    ],
)
def test_bad_field_is_named(tmp_path: Path, text: str, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(_write(tmp_path, text))
    message = str(raised.value)
    assert f"'{field}'" in message and problem in message
    assert "\n" not in message  # one problem, one line


def test_several_problems_are_one_line_each(tmp_path: Path) -> None:
    text = GOOD.replace("6379/0", "99999/0") + "http_port: -1\n"
    with pytest.raises(ConfigError) as raised:
        load_config(_write(tmp_path, text))
    lines = str(raised.value).splitlines()
    assert len(lines) == 3 and "'redis_url'" in lines[1] and "'http_port'" in lines[2]


CLUSTER = GOOD.replace(
    "redis_url: redis://127.0.0.1:6379/0", "redis_cluster: [redis://10.0.0.1:7000, redis://10.0.0.2:7000]"
)


def test_redis_cluster_gives_redis_url_its_first_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(_write(tmp_path, CLUSTER + "sharded_pubsub: true\nper_stream_channels: true\n"))
    assert config.redis_cluster == ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]
    assert config.redis_url == "redis://10.0.0.1:7000"
    monkeypatch.setenv("FANOUT_REDIS_CLUSTER", '["redis://10.0.0.9:7000"]')
    assert load_config(_write(tmp_path, CLUSTER)).redis_url == "redis://10.0.0.9:7000"


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        (CLUSTER.replace("redis://10.0.0.2:7000", "unix:///tmp/r.sock"), "redis_cluster", "unix sockets"),
        (CLUSTER.replace("10.0.0.2:7000", "10.0.0.2:7000/2"), "redis_cluster", "database 0 only"),
        (CLUSTER.replace("10.0.0.2:7000", "10.0.0.2:port"), "redis_cluster", "malformed"),
        (CLUSTER + "sharded_pubsub: true\n", "(top level)", "per_stream_channels: true"),
    ],
)
def test_bad_cluster_settings_are_named(tmp_path: Path, text: str, field: str, problem: str) -> None:
    test_bad_field_is_named(tmp_path, text, field, problem)


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "a: [1, 2"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(_write(tmp_path, "- 1\n- 2\n"))


def test_cli_exits_2_with_field_named_and_no_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD + "max_line_bytes: 10\n")
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", "check-config", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "'max_line_bytes'" in result.stderr
    assert "Traceback" not in result.stderr


def test_transaction_pooler_sends_sessions_to_the_direct_url(tmp_path: Path) -> None:
    direct = "postgresql://postgres@db:5432/fanout"
    pooled = load_config(
        _write(tmp_path, GOOD + f"database_pooler: transaction\ndatabase_direct_url: {direct}\n")
    )
    assert pooled.session_database_url == direct
    assert (
        load_config(_write(tmp_path, GOOD)).session_database_url
        == "postgresql://postgres@127.0.0.1:5432/fanout"
    )
