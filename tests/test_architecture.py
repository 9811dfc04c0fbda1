"""The house's floors, read from the source: no import runs back up, and no circle.

Every ``import`` and ``from ... import`` statement in the packages (function-local
ones too: a lazy import is still a dependency) is resolved to the module it names.
Each module sits on a floor; a module may import its own floor or lower ones only,
and the module graph has no cycle. A new module must be given a floor here, so the
layering is decided when the module is added, not discovered later.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("scalegnn", "baselines", "sweeps", "analysis", "benchmarks")  # folders; all import as scalegnn.*

# Lowest first. An entry names one module, or with ".*" a package and every module in it;
# the longest match decides a module's floor, and a module that matches none has none.
FLOORS = [
    ("foundations", ["scalegnn.fileio", "scalegnn.device", "scalegnn.ranges", "scalegnn.settings",
                     "scalegnn.csr", "scalegnn.graph", "scalegnn.records", "scalegnn.progress", "scalegnn._fastsample",
                     "scalegnn._elementwise",
                     "scalegnn.datasets.*", "scalegnn.sampling", "scalegnn.systems", "scalegnn.signals",
                     "scalegnn.threads", "scalegnn.timing", "scalegnn.metrics",
                     "scalegnn.rowsparse", "scalegnn.functional"]),
    # Leaving parallel/ in another change; it imports only threads, signals and device.
    ("process launch", ["scalegnn.parallel.launch"]),
    # The parallel core: below every application component, so none of them leaks into it.
    ("parallel grid", ["scalegnn.parallel", "scalegnn.parallel.grid"]),
    ("parallel collectives", ["scalegnn.parallel.collectives", "scalegnn.parallel.layout"]),
    ("parallel context", ["scalegnn.parallel.context"]),
    ("parallel operators", ["scalegnn.parallel.products", "scalegnn.parallel.tail", "scalegnn.parallel.losses"]),
    ("components", ["scalegnn.permutation", "scalegnn.model", "scalegnn.perf", "scalegnn.optim", "scalegnn.engine",
                    "scalegnn.checkpoint", "scalegnn.loop"]),
    # The parallel application: the core put to work on the components' model and data.
    ("parallel data", ["scalegnn.parallel.sharding", "scalegnn.parallel.dist_sampling"]),
    ("parallel model", ["scalegnn.parallel.model"]),
    ("parallel engine", ["scalegnn.parallel.engine"]),
    ("trainers", ["scalegnn.config", "scalegnn.trainer", "scalegnn.run", "scalegnn.perfmodel",
                  "scalegnn.baselines.*"]),
    ("analysis", ["scalegnn.analysis.*"]),
    ("harness", ["scalegnn.sweeps.*", "scalegnn.benchmarks.*"]),
    # The package itself re-exports the API (scalegnn.train, scalegnn.Graph, ...): it is the top.
    ("front", ["scalegnn", "scalegnn.api", "scalegnn.cli", "scalegnn.demo", "scalegnn.__main__"]),
]

def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts if package == "scalegnn" else ("scalegnn", *parts)  # installed as scalegnn.<folder>
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module ``name`` refers to: itself, or its closest enclosing module
    (``scalegnn.parallel.grid.cube_3d`` -> ``scalegnn.parallel.grid``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            names = [f"{base}.{alias.name}" for alias in node.names]  # a name may be a submodule
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES[1:]:
                BARE.append(f"{module} imports {name}")
            if name.split(".")[0] == "scalegnn":
                target = _resolve(name)
                if target is not None and target != module:
                    found.add(target)
    return found


BARE: list[str] = []  # imports of a harness folder by its folder name (not installed under that name)
GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_the_harness_folders_are_imported_inside_the_scalegnn_package():
    """pip installs analysis/, baselines/, sweeps/ and benchmarks/ as scalegnn.analysis, ...
    (no top-level names of their own): every import says so, and pyproject.toml lists
    every package folder with its place."""
    import tomllib

    assert not BARE, BARE
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = setup["package-dir"]
    folders = {".".join(p.parent.relative_to(ROOT).parts) for package in PACKAGES
               for p in (ROOT / package).rglob("__init__.py")}
    listed = set()
    for pkg in setup["packages"]:
        top = next((k for k in dirs if pkg == k or pkg.startswith(k + ".")), None)
        listed.add(pkg if top is None else dirs[top].replace("/", ".") + pkg[len(top):])
    assert listed == folders, (sorted(listed ^ folders))


def floor_of(module: str) -> int | None:
    best = None
    for level, (_, entries) in enumerate(FLOORS):
        for entry in entries:
            name = entry.removesuffix(".*")
            inside = entry.endswith(".*") and module.startswith(name + ".")
            if (module == name or inside) and (best is None or len(name) > best[1]):
                best = (level, len(name))
    return None if best is None else best[0]


def test_every_module_has_a_floor():
    assert not [m for m in MODULES if floor_of(m) is None], "give these modules a floor in FLOORS"


def test_no_import_runs_back_up():
    upward = [f"{m} ({FLOORS[floor_of(m)][0]}) imports {d} ({FLOORS[floor_of(d)][0]})"
              for m, deps in sorted(GRAPH.items()) for d in sorted(deps) if floor_of(d) > floor_of(m)]
    assert not upward, "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_circle_between_modules():
    """A package's ``__init__`` re-exporting its own submodules is not a circle of the
    house: those edges (package -> its submodule) are left out."""
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in GRAPH.items()}
    assert _cycles(graph) == []


def test_the_checks_can_fail():
    """The two checks catch what they are for, on a made-up graph."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert floor_of("scalegnn.cli") > floor_of("scalegnn.sweeps.launcher") > floor_of("scalegnn.trainer") \
        > floor_of("scalegnn.parallel.engine") > floor_of("scalegnn.model") > floor_of("scalegnn.parallel.products") \
        > floor_of("scalegnn.parallel.context") > floor_of("scalegnn.parallel.grid") > floor_of("scalegnn.graph")
    assert floor_of("scalegnn.parallel.unlisted") is None and floor_of("scalegnn.unlisted") is None
    assert "scalegnn.parallel.grid" in GRAPH["scalegnn.config"]  # imports are really read
    assert _resolve("scalegnn.parallel.grid.cube_3d") == "scalegnn.parallel.grid"


def test_no_test_module_imports_another():
    """Shared helpers live in tests/graphs.py, tests/files.py and friends, and shared
    fixtures in tests/conftest.py: a test module imported by another would run its
    tests twice and tie the two files together."""
    tests = Path(__file__).resolve().parent
    offenders = []
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name} imports {n}" for n in names if n.startswith("tests.test_")]
    assert not offenders, "\n".join(offenders)
