"""The import graph of ``src/dpprecond``: no cycle, and the layers import only downwards.

Read from the source with ``ast`` (nothing is imported): every ``import dpprecond...`` and
``from dpprecond... import ...`` statement, at module level or deferred inside a function,
is an edge from its module to the module it names (``from pkg import sub`` names the
submodule ``pkg.sub`` when there is one, else the package).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: Cycles that a change under way removes (the federated config/accounting pair); an entry
#: here only tolerates that exact cycle, and nothing else.
PENDING_CYCLES: set[frozenset[str]] = set()


@cache
def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in (SRC / "dpprecond").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _resolve(name: str, member: str | None = None) -> str | None:
    mods = _modules()
    if member is not None and f"{name}.{member}" in mods:
        return f"{name}.{member}"
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """The dpprecond modules that ``module`` imports (anywhere in its body)."""
    path, is_pkg = _modules()[module]
    package = module if is_pkg else module.rpartition(".")[0]
    out: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(_resolve(a.name) for a in node.names if a.name.startswith("dpprecond"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.startswith("dpprecond"):
                out.update(_resolve(base, a.name) for a in node.names)
    out.discard(None)
    out.discard(module)
    return {m for m in out if m is not None}


def _graph() -> dict[str, set[str]]:
    return {m: _imports(m) for m in _modules()}


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read() -> None:
    graph = _graph()
    assert "dpprecond.pca.rows" in graph and "dpprecond.noise" in graph["dpprecond.pca.core"]
    assert "dpprecond.pca.rows" in graph["dpprecond.adapters.dask"]


def test_no_import_cycle() -> None:
    cycles = [sorted(c) for c in _cycles(_graph()) if c not in PENDING_CYCLES]
    assert cycles == [], f"import cycles: {cycles}"


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        frozenset({"a", "b", "c"})]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_pca_and_fl_never_import_adapters() -> None:
    """The engines' adapters sit above pca and fl; those register themselves (the Dask
    row source: :func:`dpprecond.pca.rows.register_row_source`)."""
    wrong = [(m, d) for m, deps in _graph().items() if _in(m, "dpprecond.pca", "dpprecond.fl")
             for d in sorted(deps) if _in(d, "dpprecond.adapters")]
    assert wrong == []


def _in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_inner_layers_never_import_outer_ones() -> None:
    """accounting, noise, secure and _validation are the floor; pca and fl never import
    the shells (pipeline, experiments, cli, adapters) nor each other."""
    floor = ("dpprecond.accounting", "dpprecond.noise", "dpprecond.secure",
             "dpprecond._validation")
    engines = ("dpprecond.pca", "dpprecond.fl")
    shells = ("dpprecond.pipeline", "dpprecond.experiments", "dpprecond.cli",
              "dpprecond.adapters")
    wrong = []
    for module, deps in _graph().items():
        forbidden: tuple[str, ...] = ()
        if _in(module, *floor):
            forbidden = (*engines, *shells)
        elif _in(module, "dpprecond.pca"):
            forbidden = ("dpprecond.fl", *shells)
        elif _in(module, "dpprecond.fl"):
            forbidden = ("dpprecond.pca", *shells)
        wrong += [(module, d) for d in sorted(deps) if _in(d, *forbidden)]
    assert wrong == []


def test_benchmarks_and_the_package_never_import_tests() -> None:
    root = SRC.parent
    wrong = []
    for path in [*(root / "benchmarks").rglob("*.py"), *(SRC / "dpprecond").rglob("*.py"),
                 *(root / "examples").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            wrong += [(str(path.relative_to(root)), n) for n in names
                      if n == "tests" or n.startswith("tests.")]
    assert wrong == []
