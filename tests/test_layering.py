"""The house rules, enforced: one-way imports between layers, no import circles, a core
that needs neither torch nor the hardware database, and modules and functions of a size a
reader can hold.

Layers of ``simulator`` from the bottom (a package may import only packages of a lower
rank, or itself); every import counts, including those inside functions.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
PACKAGES = ("simulator", "calibrate", "hardware_db")

RANK = {
    "simulator.errors": 0, "simulator.progress": 0,
    "simulator.frameworks": 1, "simulator.hardware": 1,
    "simulator.network": 2,
    "simulator.workload": 3,
    "simulator.parallel": 4,
    "simulator.cost": 5,
    "simulator.memory": 6,
    "simulator.engine": 7,
    "simulator.report": 8,
    # ---- above the core -------------------------------------------------------------------
    "simulator.modules": 9, "simulator.uncertainty": 9,
    "simulator.search": 10,
    "simulator.planning": 11,
    "simulator.validation": 12,
    "simulator.api": 13,
    "simulator.cli": 14,
}
CORE_MAX_RANK = 8
NEVER_IN_CORE = ("torch", "calibrate", "hardware_db", "pynvml")
LAZY_ONLY = ("scipy", "pyarrow", "networkx", "matplotlib", "ray", "torch")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


_MODULES = {_module_name(p) for p in _files()}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module, at module top level?) for every import in the file. ``from X
    import name`` yields ``X.name`` where that is a module of ours (``from . import
    loaders`` depends on ``loaders``, not on the package's ``__init__``), else ``X``."""
    mod = _module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub if sub in _MODULES else target, id(node) in top))
    return out


def _graph() -> nx.DiGraph:
    mods = {_module_name(p): p for p in _files()}
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for target, _ in _imports(path):
            if target in mods and target != name:
                g.add_edge(name, target)
    return g


def _package(mod: str) -> str | None:
    best = None
    for pkg in RANK:
        if mod == pkg or mod.startswith(pkg + "."):
            best = pkg if best is None or len(pkg) > len(best) else best
    return best


def test_every_simulator_module_has_a_layer():
    loose = [m for m in _graph() if m.startswith("simulator.") and _package(m) is None]
    assert not loose, f"modules outside every layer (add them to RANK): {loose}"


def test_no_import_circles():
    g = _graph()
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import circles: {cycles[:5]}"
    # also between packages of the simulator
    pg = nx.DiGraph((_package(a), _package(b)) for a, b in g.edges
                    if _package(a) and _package(b) and _package(a) != _package(b))
    assert nx.is_directed_acyclic_graph(pg), list(nx.simple_cycles(pg))[:5]


def upward(edges) -> list[str]:
    bad = []
    for a, b in edges:
        pa, pb = _package(a), _package(b)
        if pa and pb and pa != pb and RANK[pb] >= RANK[pa]:
            bad.append(f"{a} -> {b}")
    return bad


def test_imports_only_go_down_the_layers():
    bad = upward(_graph().edges)
    assert not bad, "upward or sideways imports: " + "; ".join(bad)


def test_core_needs_no_torch_no_hardware_db_and_imports_heavy_libraries_lazily():
    bad = []
    for path in _files():
        mod = _module_name(path)
        pkg = _package(mod)
        if pkg is None or RANK[pkg] > CORE_MAX_RANK:
            continue
        for target, top in _imports(path):
            root = target.split(".")[0]
            if root in NEVER_IN_CORE:
                bad.append(f"{mod} imports {target}")
            elif root in LAZY_ONLY and top:
                bad.append(f"{mod} imports {target} at module level (import it where used)")
    assert not bad, bad


def test_hardware_db_and_calibrate_depend_on_the_simulator_only_through_its_core():
    bad = []
    for path in _files():
        mod = _module_name(path)
        if not mod.startswith(("hardware_db", "calibrate")):
            continue
        for target, _ in _imports(path):
            pkg = _package(target) if target.startswith("simulator.") else None
            if pkg and RANK[pkg] > CORE_MAX_RANK and not (mod.startswith("calibrate")
                                                          and pkg == "simulator.workload"):
                bad.append(f"{mod} -> {target}")
            if mod.startswith("hardware_db") and target.split(".")[0] == "calibrate":
                bad.append(f"{mod} -> {target}")
    assert not bad, bad


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_function_sizes(path: Path):
    lines = path.read_text().count("\n")
    assert lines <= MAX_MODULE_LINES, f"{lines} lines: split the module"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_rules_catch_a_violation():
    """The checker itself: upward and sideways edges are found, downward ones pass."""
    assert upward([("simulator.cost.kernels", "simulator.cli.registry")])
    assert upward([("simulator.frameworks.defaults", "simulator.hardware.specs")])  # same rank
    assert not upward([("simulator.cli.main", "simulator.cost.kernels")])
    g = nx.DiGraph([("a", "b"), ("b", "a")])
    assert list(nx.simple_cycles(g))
