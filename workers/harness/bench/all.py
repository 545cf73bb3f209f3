"""`fanout bench all`: every benchmark in turn, then one JSON file and docs/benchmarks.md from them.

Each benchmark runs as its own `fanout bench NAME` process (a fresh interpreter and heap each, as
when run alone), its JSON result read from its stdout and turned into figures by its module's
`figures()`. The Markdown table (figure, ceiling, ratio, target, met) is written with the machine,
the commit and the exact command, so the file says how to reproduce itself. Beside each figure
stands the same figure from the previous run (`--previous`, by default the JSON file this run
replaces, or the table it replaces when there is none: a clone has the committed
docs/benchmarks.md but no out/), so a change is read against the commit before it. What follows
`KEPT_BELOW` in the Markdown file is written by hand (the scenarios' descriptions) and kept. A
benchmark that fails or cannot run here (no valgrind for `instructions`) is listed as such; the
others still run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workers.harness.bench._common import Figure, machine, markdown_table, progress

#: name -> extra arguments of the quick configuration (`--quick`: a smoke run, not figures to keep).
BENCHES: dict[str, list[str]] = {
    "idgen": ["--repeats", "3", "--startup-rows", "20000", "--startup-runs", "3", "--processes", "1,2"],
    "pubsub": ["--subscribers", "1,4", "--rows", "5000", "--latency-seconds", "1"],
    "cluster": ["--seconds", "1", "--rounds", "1", "--rss-events", "0"],
    "http": ["--seconds", "2"],
    "longpoll": ["--polls", "1000", "--room-members", "200", "--idle-seconds", "2"],
    "crowd": (
        "--polls 200 --rooms 5 --members 4 --polls-per-idle-user 20 --idle-seconds 3 --poll-timeout 2"
        " --rounds 2 --round-gap 0.5 --client-processes 2"
    ).split(),
    "live": "--rates 20,max --seconds 2 --min-events 0 --rooms 3 --closed-loop 4".split(),
    "audit": ["--rows", "100000"],
    "instructions": ["--events", "2000"],
    "scale": ["--base-only", "--seconds", "1", "--backends", "single"],
    "ratelimit": ["--checks", "300", "--sends", "50"],
    "demo": ["--actions", "150", "--users", "6", "--rooms", "3", "--concurrency", "4"],
    "idle": ["--actions", "40", "--settle", "2", "--seconds", "5"],
    "peer": ["--quick"],
}


def _run_one(name: str, extra: list[str]) -> tuple[dict[str, Any] | None, str]:
    """Run `fanout bench NAME` and return its JSON result (None on failure) and a status line; a
    failure's status ends with the last line the benchmark wrote on stderr (its reason, or a
    traceback's last line), which is passed through as it comes."""
    command = [sys.executable, "-m", "workers.cli", "bench", name, *extra]
    progress(f"== fanout bench {name} {shlex.join(extra)}")
    started = time.monotonic()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        out, err = child.stdout, child.stderr
        assert out is not None and err is not None
        stdout: list[bytes] = []
        reader = threading.Thread(target=lambda: stdout.append(out.read()))
        reader.start()
        tail = b""
        while chunk := os.read(err.fileno(), 65536):
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            tail = (tail + chunk)[-4096:]
        reader.join()
        code = child.wait()
    took = f"{time.monotonic() - started:.0f} s"
    lines = [line.strip() for line in tail.decode(errors="replace").replace("\r", "\n").splitlines()]
    said = next((line for line in reversed(lines) if line), "")[:200].replace("|", "/")  # a table cell
    why = f": {said}" if said else ""
    try:
        result, _ = json.JSONDecoder().raw_decode(b"".join(stdout).decode().lstrip())
    except ValueError:
        return None, f"failed (exit {code}, no result) after {took}{why}"
    if not isinstance(result, dict):
        return None, f"failed (result is not a JSON object) after {took}{why}"
    return result, f"ran in {took} (exit {code})"


#: Where the generated part of docs/benchmarks.md ends: what follows is written by hand and kept.
KEPT_BELOW = "<!-- Written by hand from here on: `fanout bench all` keeps it. -->"


def kept_part(path: Path) -> str:
    """The hand-written end of the file at `path`, from `KEPT_BELOW` on ("" when none)."""
    text = path.read_text() if path.exists() else ""
    start = text.find(KEPT_BELOW)
    return text[start:] if start >= 0 else ""


def commit() -> str:
    """The checked-out commit (short), `+changes` when the work tree differs from it; "" outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


def previous_run(path: Path | None) -> tuple[dict[tuple[str, str], float], str]:
    """The figures of the run recorded at `path`, by (benchmark, figure), and a line saying which
    run it was; ({}, "") when there is none. `path` is an earlier `--json`, or a table this command
    wrote (a `.md` file; its figures as rounded there)."""
    if path is None or not path.exists():
        return {}, ""
    if path.suffix == ".md":
        return _previous_table(path)
    try:
        document = json.loads(path.read_text())
        values = {
            (f["benchmark"], f["name"]): float(f["value"])
            for f in document["figures"]
            if f["value"] is not None
        }
    except (ValueError, KeyError, TypeError):
        progress(f"{path}: not a `fanout bench all` result; no previous figures")
        return {}, ""
    which = f"commit {document['commit']}, " if document.get("commit") else ""
    return values, f"`{document.get('command', '?')}` at {which}{document.get('when', '?')}"


#: The line `render` opens a table with: the command, when, and the commit when known.
_GENERATED = re.compile(
    r"^Generated by (`[^`]+`) on (.+?)(?: at commit (\S+?))?(?: \(.*\))?; do not edit", re.M
)


def _previous_table(path: Path) -> tuple[dict[tuple[str, str], float], str]:
    """`previous_run` of a table `render` wrote: each figure's value cell read back as a number."""
    text = path.read_text()
    made = _GENERATED.search(text)
    if made is None:
        progress(f"{path}: not a table `fanout bench all` wrote; no previous figures")
        return {}, ""
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        cells = line.strip().strip("|").split(" | ")
        if len(cells) < 6 or cells[0].strip() == "benchmark":
            continue
        try:
            values[cells[0].strip(), cells[1]] = float(cells[2].split()[0].replace(",", ""))
        except (ValueError, IndexError):
            continue  # "-": the figure had no value then
    command, when, commit_id = made.groups()
    return values, f"{command} at {f'commit {commit_id}, ' if commit_id else ''}{when}"


def render(
    figures: list[Figure],
    statuses: dict[str, str],
    command: str,
    when: str,
    kept: str = "",
    previous: tuple[dict[tuple[str, str], float], str] = ({}, ""),
    commit_id: str = "",
    read_at: str = "",
) -> str:
    """docs/benchmarks.md: how it was made, then the table (with the `previous` run's figures when
    there are any), then each benchmark's status, then `kept` (the hand-written part of the file it
    replaces)."""
    values, which = previous
    at_commit = f" at commit {commit_id}" if commit_id else ""
    if read_at:
        at_commit += f" (its results read again by commit {read_at}: `fanout bench all --render`)"
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` on {when}{at_commit}; do not edit by hand.",
        f"Machine: {machine()}. Every ceiling is measured in the same run as its figure (this",
        "machine is shared and noisy: compare ratios, not absolute rates, across runs). What each",
        "benchmark measures and how is in its module docstring (`workers/harness/bench/`); the",
        "scenarios are described below the tables.",
        *([f"The column `previous` holds the figures of {which}."] if which else []),
        "",
        markdown_table(figures, values if which else None),
        "",
        "| benchmark | status |",
        "|---|---|",
        *[f"| {name} | {status} |" for name, status in statuses.items()],
        "",
    ]
    return "\n".join(lines) + ("\n" + kept if kept else "")


def _render_again(
    recorded: Path, out_json: Path, out_markdown: Path, previous: tuple[dict[tuple[str, str], float], str]
) -> int:
    """`--render`: the figures of a recorded run's results, as this tree's `figures()` read them
    (beside `--previous`'s, when given)."""
    try:
        document = json.loads(recorded.read_text())
        results: dict[str, Any] = document["results"]
        figures: list[Figure] = []
        for name, result in results.items():
            figures += importlib.import_module(f"workers.harness.bench.{name}").figures(result)
    except (OSError, ValueError, KeyError, TypeError) as e:
        progress(f"{recorded}: not a `fanout bench all` result ({e})")
        return 2
    document["figures"] = [vars(f) for f in figures]
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(document, indent=2))
    out_markdown.write_text(
        render(
            figures, document["statuses"], document["command"], document["when"], kept_part(out_markdown),
            previous, document.get("commit", ""), read_at=commit(),
        )
    )  # fmt: skip
    progress(f"wrote {out_json} and {out_markdown} from {recorded}")
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fanout bench all", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHES)}")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not figures to keep")
    p.add_argument("--json", type=Path, default=Path("out/bench/all.json"), help="where the results go")
    p.add_argument("--markdown", type=Path, default=Path("docs/benchmarks.md"), help="the generated table")
    p.add_argument(
        "--previous",
        type=Path,
        help="an earlier result (its --json, or a table it wrote) whose figures go beside these"
        " (default: --json as it was, else --markdown as it was; with --render, none unless given)",
    )
    p.add_argument(
        "--render",
        type=Path,
        metavar="RESULT",
        help="run nothing: the figures and the table again from a recorded --json result, read by"
        " this tree's benchmarks (after a change to how a figure is judged)",
    )
    args = p.parse_args(argv)
    if args.render is not None:
        return _render_again(args.render, args.json, args.markdown, previous_run(args.previous))
    names = args.only.split(",") if args.only else list(BENCHES)
    unknown = sorted(set(names) - BENCHES.keys())
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(unknown)}")
    previous = previous_run(args.previous or (args.json if args.json.exists() else args.markdown))
    results: dict[str, Any] = {}
    statuses: dict[str, str] = {}
    figures: list[Figure] = []
    for name in names:
        result, statuses[name] = _run_one(name, BENCHES[name] if args.quick else [])
        if result is None:
            continue
        results[name] = result
        module = importlib.import_module(f"workers.harness.bench.{name}")
        figures += module.figures(result)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = (
        "fanout bench all"
        + (f" --only {args.only}" if args.only else "")
        + (" --quick" if args.quick else "")
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    commit_id = commit()
    document = {
        "command": command,
        "when": when,
        "commit": commit_id,
        "machine": machine(),
        "results": results,
        "figures": [vars(f) for f in figures],
        "statuses": statuses,
    }
    args.json.write_text(json.dumps(document, indent=2))
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(
        render(figures, statuses, command, when, kept_part(args.markdown), previous, commit_id)
    )
    progress(markdown_table(figures, previous[0] if previous[1] else None))
    progress(f"wrote {args.json} and {args.markdown}")
    return 0 if len(results) == len(names) else 1
