"""The settings of a cluster exposed to the internet: registration closed unless said otherwise,
the old `enable_registration` refused with the new name, and Synapse-shaped rate limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers.test_config import GOOD, _write
from workers.config import ConfigError, RateLimit, load_config


def test_registration_is_closed_and_limits_are_synapses_by_default(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, GOOD))
    assert config.registration == "closed"
    assert config.rc_message == RateLimit(per_second=0.2, burst_count=10)
    assert config.rc_login.failed_attempts == RateLimit(per_second=0.17, burst_count=3)
    assert config.rc_exempt_addresses == [] and config.rc_exempt_admins and not config.x_forwarded


@pytest.mark.parametrize("old", ["true", "false"])
def test_enable_registration_names_its_replacement(tmp_path: Path, old: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(_write(tmp_path, GOOD + f"enable_registration: {old}\n"))
    assert "registration: closed | open | token" in str(refused.value)
    assert "enable_registration: true is registration: open" in str(refused.value)


def test_rate_limit_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = GOOD + (
        "registration: token\n"
        "rc_message: null\n"
        "rc_login: {failed_attempts: {per_second: 0.5, burst_count: 2}}\n"
        "rc_exempt_addresses: [10.0.0.0/8, '::1']\n"
    )
    monkeypatch.setenv("FANOUT_RC_JOINS", '{"per_second": 2, "burst_count": 4}')
    config = load_config(_write(tmp_path, text))
    assert config.registration == "token" and config.rc_message is None
    assert config.rc_login.failed_attempts == RateLimit(per_second=0.5, burst_count=2)
    assert config.rc_login.address == RateLimit(per_second=0.17, burst_count=3)  # the others keep theirs
    assert config.rc_joins == RateLimit(per_second=2, burst_count=4)
    for bad, field in [
        ("rc_message: {per_second: 0, burst_count: 1}", "rc_message.per_second"),
        ("rc_message: {per_second: 1, burst: 1}", "rc_message.burst"),
        ("rc_exempt_addresses: [not-an-address]", "rc_exempt_addresses"),
        ("registration: maybe", "registration"),
    ]:
        with pytest.raises(ConfigError) as refused:
            load_config(_write(tmp_path, GOOD + bad + "\n"))
        assert f"field '{field}'" in str(refused.value), (bad, str(refused.value))
