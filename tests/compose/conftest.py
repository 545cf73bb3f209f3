"""tests/compose: the `containers` marker. Its test builds images and runs the stack on a Docker
engine (minutes, more from nothing), so `make test` leaves it out; `make containers` is the release
check that runs it as a command, and `pytest -m containers` selects it in the suite."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "containers: the stack on a Docker engine (make containers)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "containers" in (config.getoption("markexpr") or ""):
        return
    chosen = [item for item in items if item.get_closest_marker("containers") is None]
    left = [item for item in items if item.get_closest_marker("containers") is not None]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = chosen
