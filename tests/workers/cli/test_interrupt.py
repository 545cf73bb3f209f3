"""Ctrl-C on a long command (`fanout demo` mid-load): one line, exit 130, no traceback, and nothing
the command started left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _processes_under(workdir: Path) -> list[str]:
    """Command lines of the processes naming `workdir` (the demo's workers and servers)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(workdir) in cmdline and "pytest" not in cmdline:
            found.append(cmdline)
    return found


def _as_from_a_terminal() -> None:
    """SIGINT as a command typed at a terminal has it: a suite started in the background by a shell
    without job control inherits SIGINT ignored, and so would the demo (Python keeps an ignored
    SIGINT ignored), which would then never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_the_demos_load_is_one_line_and_stops_the_cluster(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    demo = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "demo", "--no-audit", "--no-synapse-judge",
         "--workdir", str(workdir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_as_from_a_terminal,
    )  # fmt: skip
    lines = []
    try:
        assert demo.stdout is not None
        deadline = time.monotonic() + 180
        for line in demo.stdout:
            lines.append(line)
            if "actions" in line and "/3000" in line and not line.strip().startswith("0/"):
                break  # the load runs
            assert time.monotonic() < deadline, "".join(lines)
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    output = "".join(lines) + rest
    assert demo.returncode == 130, output
    assert "fanout demo: interrupted" in output, output
    assert "Traceback" not in output and "never retrieved" not in output, output
    time.sleep(1)
    assert not _processes_under(workdir), _processes_under(workdir)
