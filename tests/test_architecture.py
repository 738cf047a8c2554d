"""The architecture's rules as failures: every import of epmci/ and engine/ (function-local
ones included) is parsed with `ast`, and

- engine/ never imports epmci, and epmci never imports engine (the gate talks to any engine,
  the bundled one included, through docs/engine-contract.md only);
- epmci's packages form layers, and an import only points down (or within its package);
- no import cycle inside epmci or engine, at module level.

The scanner is tested on a small synthetic package with a cycle and a forbidden edge, so a
scanner that finds nothing cannot pass the real tree.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# epmci's packages, bottom first: a module may import from its own package and lower ones.
EPMCI_LAYERS = [
    {"errors", "units", "fsutil", "cgroups"},
    {"gguf"},           # what a model file is, read without any engine
    {"reference"},      # the independent NumPy forward
    {"synth"},          # the model maker (uses the reference to calibrate routing)
    {"compare"},        # pure numerics of the verdicts
    {"contract"},       # how to talk to an engine
    {"config"},         # settings and the experiment catalog
    {"perf"},           # measurement and baselines
    {"check"},          # the gate's suites
    {"report"},         # renderings of a check
    {"cli", "__main__"},
]


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(root: Path) -> dict[str, set[str]]:
    """module -> the modules (or packages) it imports, relative imports resolved; imports
    inside functions and classes count too."""
    out: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        mod = module_name(root, path)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets.add(prefix)
                targets.update(f"{prefix}.{a.name}" for a in node.names)   # `from pkg import module`
        out[mod] = targets
    return out


def internal_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Only the edges between modules of the scanned tree."""
    return {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted. A
    package's __init__ importing its own submodules is not a cycle by itself: edges from a
    submodule to its parent package are dropped (importing the package means its __init__
    has already run)."""
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in internal_edges(graph).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def foreign_imports(graph: dict[str, set[str]], forbidden_top: str) -> list[str]:
    return sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                  if t == forbidden_top or t.startswith(forbidden_top + "."))


def upward_imports(graph: dict[str, set[str]], top: str, layers: list[set[str]]) -> list[str]:
    rank = {p: i for i, ps in enumerate(layers) for p in ps}
    bad, unplaced = [], set()
    for m, ts in internal_edges(graph).items():
        parts = m.split(".")
        if len(parts) < 2:
            continue          # the top package's own __init__
        for t in ts:
            tp = t.split(".")
            if len(tp) < 2 or tp[1] == parts[1]:
                continue
            for p in (parts[1], tp[1]):
                if p not in rank:
                    unplaced.add(p)
            if parts[1] in rank and tp[1] in rank and rank[tp[1]] > rank[parts[1]]:
                bad.append(f"{m} -> {t} ({parts[1]} is below {tp[1]})")
    bad += [f"{top}.{p} is in no layer of the architecture" for p in sorted(unplaced)]
    return sorted(bad)


# ----------------------------------------------------------------- the real tree

@pytest.fixture(scope="module")
def epmci_graph():
    return imports_of(REPO / "epmci")


@pytest.fixture(scope="module")
def engine_graph():
    return imports_of(REPO / "engine")


def test_engine_and_epmci_never_import_each_other(epmci_graph, engine_graph):
    assert foreign_imports(engine_graph, "epmci") == []
    assert foreign_imports(epmci_graph, "engine") == []


def test_epmci_imports_point_down_the_layers(epmci_graph):
    assert upward_imports(epmci_graph, "epmci", EPMCI_LAYERS) == []


def test_no_import_cycles(epmci_graph, engine_graph):
    assert cycles(epmci_graph) == []
    assert cycles(engine_graph) == []


def test_the_scan_sees_function_local_and_relative_imports(epmci_graph):
    # reachable only through a relative import: a scan that misses them would see no edges
    assert "epmci.gguf.file" in epmci_graph["epmci.gguf.facts"]
    assert len(internal_edges(epmci_graph)["epmci.check.runner"]) > 5


# ----------------------------------------------------------------- the scanner on a synthetic tree

def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def test_the_scanner_finds_a_cycle_hidden_in_a_function_and_a_forbidden_edge(tmp_path):
    pkg = _package(tmp_path / "app", {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from ..high import b   # deferred: hides the cycle from a module-level scan\n",
        "high/__init__.py": "",
        "high/b.py": "from ..low import a\nimport engine.kernels\n",
        "odd/__init__.py": "",
    })
    graph = imports_of(pkg)
    assert cycles(graph) == [["app.high.b", "app.low.a"]]
    assert foreign_imports(graph, "engine") == ["app.high.b -> engine.kernels"]
    bad = upward_imports(graph, "app", [{"low"}, {"high"}])
    assert bad == ["app.low.a -> app.high (low is below high)", "app.low.a -> app.high.b (low is below high)"]
    # a package that no layer names is an error too, once something imports across it
    (pkg / "odd" / "c.py").write_text("from ..low import a\n")
    assert "app.odd is in no layer of the architecture" in upward_imports(imports_of(pkg), "app",
                                                                          [{"low"}, {"high"}])


def test_a_clean_tree_passes_the_scanner(tmp_path):
    pkg = _package(tmp_path / "app", {
        "__init__.py": "",
        "low/__init__.py": "from .a import f\n",
        "low/a.py": "def f():\n    return 1\n",
        "high/__init__.py": "",
        "high/b.py": "from ..low import f\nfrom ..low.a import f as g\n",
    })
    graph = imports_of(pkg)
    assert cycles(graph) == [] and foreign_imports(graph, "engine") == []
    assert upward_imports(graph, "app", [{"low"}, {"high"}]) == []
