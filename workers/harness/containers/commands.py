"""Command lines of the Docker engine, Compose and debootstrap, run with their output kept.

`run` captures a short command's output; `run_logged` streams a long one's into a log file and
shows the lines a caller picks as progress. A command that fails raises `StepFailed`: one line
naming what failed and, for a logged one, where its output is.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


class StepFailed(Exception):
    """A step of the run failed; the message is the one line to show."""


def say(message: str) -> None:
    """One line of the run's progress, on stdout (the figures are what `make containers` shows)."""
    print(f"containers: {message}", flush=True)


def run(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    check: bool = True,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `command`, its output captured as text; with `check`, a non-zero exit raises
    `StepFailed` with the command and the last line it printed."""
    try:
        result = subprocess.run(
            list(command), env=None if env is None else dict(env), capture_output=True, text=True,
            timeout=timeout, input=input_text,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise StepFailed(f"{' '.join(command[:4])} ... did not finish in {timeout:g}s") from None
    except FileNotFoundError:
        raise StepFailed(f"{command[0]} is not installed") from None
    if check and result.returncode != 0:
        raise StepFailed(f"{' '.join(command[:6])} ... exited {result.returncode}: {last_line(result)}")
    return result


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    """The line that says why: the first naming an error, else the last."""
    lines = [line.strip() for line in (result.stderr + "\n" + result.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("ERROR", "Error", "error"))]
    return (errors or lines or ["(no output)"])[0 if errors else -1]


def run_logged(
    command: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    progress: Callable[[str], bool] | None = None,
    cwd: Path | None = None,
) -> None:
    """Run `command` with its output appended to `log`; each line `progress` accepts is shown,
    indented. A non-zero exit raises `StepFailed` naming the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        try:
            process = subprocess.Popen(
                list(command), env=None if env is None else dict(env), cwd=cwd, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1,
            )  # fmt: skip
        except FileNotFoundError:
            raise StepFailed(f"{command[0]} is not installed") from None
        assert process.stdout is not None
        last = ""
        for line in process.stdout:
            out.write(line)
            if line.strip():
                last = line.strip()
            if progress is not None and progress(line):
                print(f"    {_shorter(line.rstrip())}", flush=True)
        code = process.wait()
    if code != 0:
        raise StepFailed(f"{command[0]} {command[1] if len(command) > 1 else ''} exited {code}: {last}"
                         f" (the whole output: {log})")  # fmt: skip


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    """`docker ARGS...`'s stdout, stripped."""
    return run(["docker", *args], timeout=timeout, check=check).stdout.strip()


def _shorter(line: str, width: int = 110) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."
