"""The package layout holds: no import cycle, imports run one way, a production worker loads no harness.

The import graph is read from the source (module-level imports, including those under
`TYPE_CHECKING`, which still tie two modules' designs together); imports inside functions are the
deliberate lazy ones (the CLI dispatcher, optional extras) and are checked only for the layering rules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("idgen", "pubsub", "workers", "analytics")
#: package -> packages it must never import, at any depth (function-level imports included).
FORBIDDEN = {
    "idgen": ("pubsub", "workers", "analytics"),
    "pubsub": ("idgen", "workers", "analytics"),
    "analytics": ("idgen", "pubsub", "workers"),
}
#: What a production worker must never import: the harness and the Spark job.
NOT_IN_PRODUCTION = ("workers.harness", "analytics")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(module: str, path: Path, top_level_only: bool) -> set[str]:
    """Every project module `module` imports; `from pkg import name` counts `pkg.name` when that
    is a module, else `pkg`."""
    tree = ast.parse(path.read_text(), str(path))
    known = _modules()
    nodes: list[ast.AST] = []
    if top_level_only:
        stack: list[ast.AST] = list(tree.body)
        while stack:
            node = stack.pop()
            nodes.append(node)
            if isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
                stack.extend(ast.iter_child_nodes(node))
    else:
        nodes = list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node, path.name == "__init__.py")
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
        else:
            continue
        found.update(name for name in names if name.split(".")[0] in PACKAGES)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: _imports(name, path, top_level_only=True) & modules.keys() for name, path in modules.items()
    }


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_libraries_never_import_what_sits_above_them(package: str) -> None:
    offenders = {
        f"{name} -> {target}"
        for name, path in _modules().items()
        if name.split(".")[0] == package
        for target in _imports(name, path, top_level_only=False)
        if target.split(".")[0] in FORBIDDEN[package]
    }
    assert offenders == set()


def test_production_modules_never_import_the_harness() -> None:
    offenders = {
        f"{name} -> {target}"
        for name, path in _modules().items()
        if name.startswith("workers") and not name.startswith(NOT_IN_PRODUCTION)
        for target in _imports(name, path, top_level_only=False)
        if target.startswith(NOT_IN_PRODUCTION)
    }
    assert offenders == set()


def test_the_worker_entry_point_loads_no_harness() -> None:
    """What `fanout worker` imports, in a fresh interpreter: no harness module, no Spark."""
    probe = (
        "import sys, workers.cli, workers.cli.worker, workers.app;"
        "prefixes = ('workers.harness', 'analytics', 'pyspark');"
        "print('\\n'.join(m for m in sys.modules if m.startswith(prefixes)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.split() == []


def test_every_package_says_what_it_holds() -> None:
    """Each package's `__init__` opens with a docstring (what it holds, what it must not import)."""
    missing = [
        name
        for name, path in _modules().items()
        if path.name == "__init__.py" and ast.get_docstring(ast.parse(path.read_text())) is None
    ]
    assert missing == []


#: The handler families from the bottom up: a family imports only families before it.
HANDLER_FAMILIES = {
    "caches": 0,
    "notify": 1,
    "placement": 2,
    "rooms": 3,
    "ephemeral": 3,
    "stored": 4,
    "sync": 5,
}
#: What the worker's plumbing and its development servers may import of `workers`.
ONLY = {
    "workers.process": (
        "workers.config",
        "workers.errors",
        "workers.routing",
        "workers.storage",
        "workers.process",
    ),
    "workers.embedded": ("workers.errors", "workers.embedded"),
}
#: Past this many lines a module says why in its docstring ("over 500 lines").
MAX_LINES = 500


def _family(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["workers", "handlers"] else None


def test_handlers_are_families_only() -> None:
    loose = sorted(p.name for p in (ROOT / "workers" / "handlers").glob("*.py") if p.name != "__init__.py")
    assert loose == []
    families = {p.name for p in (ROOT / "workers" / "handlers").iterdir() if (p / "__init__.py").exists()}
    assert families == set(HANDLER_FAMILIES)


def test_handler_families_import_one_way() -> None:
    offenders = {
        f"{name} -> {target}"
        for name, path in _modules().items()
        if (family := _family(name)) is not None
        for target in _imports(name, path, top_level_only=False)
        if (
            (other := _family(target)) is not None
            and other != family
            and HANDLER_FAMILIES[other] >= HANDLER_FAMILIES[family]
        )
        or (family is not None and target.startswith(("workers.http", "workers.assembly", "workers.app")))
    }
    assert offenders == set()


@pytest.mark.parametrize("package", sorted(ONLY))
def test_plumbing_imports_only_what_it_sits_on(package: str) -> None:
    offenders = {
        f"{name} -> {target}"
        for name, path in _modules().items()
        if name.startswith(package)
        for target in _imports(name, path, top_level_only=False)
        if target.startswith("workers.") and not target.startswith(ONLY[package])
    }
    assert offenders == set()


def test_a_long_module_says_why() -> None:
    unexplained = [
        f"{name} ({lines} lines)"
        for name, path in _modules().items()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
        and "over 500 lines" not in (ast.get_docstring(ast.parse(path.read_text())) or "").lower()
    ]
    assert unexplained == []


def test_every_package_maps_its_modules() -> None:
    """Each package's `__init__` docstring names every module (`name.py`) and package (`name/`)
    directly in it."""
    unmapped = []
    for name, path in _modules().items():
        if path.name != "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        here = path.parent
        members = [p.name for p in here.glob("*.py") if p.name != "__init__.py"]
        members += [f"{p.name}/" for p in here.iterdir() if (p / "__init__.py").exists()]
        unmapped += [f"{name}: {m}" for m in sorted(members) if m not in doc]
    assert unmapped == []
