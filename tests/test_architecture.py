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

# Lowest first. The longest matching prefix decides a module's floor.
FLOORS = [
    ("foundations", ["scalegnn.fileio", "scalegnn.device", "scalegnn.ranges", "scalegnn.settings",
                     "scalegnn.csr", "scalegnn.graph", "scalegnn.records", "scalegnn.progress", "scalegnn._fastsample",
                     "scalegnn._elementwise",
                     "scalegnn.datasets", "scalegnn.sampling", "scalegnn.systems", "scalegnn.signals",
                     "scalegnn.threads"]),
    ("components", ["scalegnn.permutation", "scalegnn.model", "scalegnn.perf", "scalegnn.optim", "scalegnn.engine",
                    "scalegnn.checkpoint", "scalegnn.loop"]),
    ("parallel", ["scalegnn.parallel"]),
    ("trainers", ["scalegnn.config", "scalegnn.trainer", "scalegnn.run", "scalegnn.perfmodel",
                  "scalegnn.baselines"]),
    ("analysis", ["scalegnn.analysis"]),
    ("harness", ["scalegnn.sweeps", "scalegnn.benchmarks"]),
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
    for level, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (level, len(prefix))
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
        > floor_of("scalegnn.parallel.engine") > floor_of("scalegnn.model") > floor_of("scalegnn.graph")
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


# --------------------------------------------------------------------------- the package boundary
# From a checkout, exactly the harness folders import as scalegnn.<folder> (scalegnn/__init__.py's
# finder); installed, exactly what pyproject.toml packages: the wheel holds the one top-level name
# `scalegnn` and no test file. tests/, results/, docs/ are never part of the package.

# Run in a fresh interpreter with the checkout on PYTHONPATH: where each harness name is
# found, and which other folders of the checkout import as scalegnn.<folder>. find_spec
# resolves as `import` does without running the harness (no torch, no pandas needed).
_PROBE = """
import importlib, importlib.util, json, os, sys
import scalegnn
names = [d for d in sorted(os.listdir(sys.argv[1])) if os.path.isdir(os.path.join(sys.argv[1], d))]
found = {n: getattr(importlib.util.find_spec("scalegnn." + n), "origin", None) for n in scalegnn._HARNESS}
leaks = []
for n in names:
    if n.isidentifier() and n != "scalegnn" and n not in scalegnn._HARNESS:
        try:
            importlib.import_module("scalegnn." + n)
            leaks.append(n)
        except ModuleNotFoundError:
            pass
print(json.dumps({"scalegnn": scalegnn.__file__, "found": found, "leaks": leaks}))
"""


def _boundary_problems(root: Path, cwd: Path, *python_flags: str) -> list[str]:
    """What is wrong with the package boundary of the checkout ``root``, seen by
    ``python <flags>`` started in ``cwd`` with only ``PYTHONPATH=root``."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, *python_flags, "-c", _PROBE, str(root)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    problems = [] if seen["scalegnn"] == str(root / "scalegnn" / "__init__.py") else [f"scalegnn is {seen['scalegnn']}"]
    problems += [f"scalegnn.{n} is {origin}" for n, origin in seen["found"].items()
                 if origin != str(root / n / "__init__.py")]
    return problems + [f"scalegnn.{n} imports" for n in seen["leaks"]]


def test_from_a_checkout_exactly_the_harness_folders_import_inside_scalegnn(tmp_path):
    """With only PYTHONPATH=<checkout> (cwd elsewhere), with site-packages (where an
    editable install of another checkout may sit: this checkout wins) and without
    (-S: a bare GPU node), each harness name is this checkout's folder, and no other
    folder (tests/, results/, docs/, ...) imports as scalegnn.<folder>."""
    assert (ROOT / "tests").is_dir() and (ROOT / "results").is_dir()  # there is something to leak
    assert _boundary_problems(ROOT, tmp_path) == []
    assert _boundary_problems(ROOT, tmp_path, "-S") == []


def test_in_this_process_tests_and_results_are_not_scalegnn_subpackages():
    import importlib

    import pytest

    import scalegnn

    assert Path(scalegnn.__file__).resolve() == ROOT / "scalegnn" / "__init__.py", "run from this checkout"
    assert [Path(p).resolve() for p in scalegnn.__path__] == [ROOT / "scalegnn"]
    for name in ("tests", "results", "docs"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"scalegnn.{name}")
    for name in scalegnn._HARNESS:
        module = importlib.import_module(f"scalegnn.{name}")
        assert Path(module.__file__).resolve() == ROOT / name / "__init__.py"
    assert Path(importlib.import_module("scalegnn.baselines.distdgl").__file__).resolve().parent \
        == ROOT / "baselines" / "distdgl"  # a harness folder's own subpackage, through its __path__


def test_the_finder_list_is_pyproject_list():
    """The finder's folders (scalegnn._HARNESS), this file's PACKAGES and pyproject.toml's
    package-dir table name the same folders, each installed as scalegnn.<folder>."""
    import tomllib

    import scalegnn

    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert dirs == {f"scalegnn.{name}": name for name in scalegnn._HARNESS}
    assert set(scalegnn._HARNESS) == set(PACKAGES) - {"scalegnn"}


def _wheel_problems(names: list[str]) -> list[str]:
    """What a wheel's file list must not hold: a top-level name besides scalegnn (and its
    .dist-info), a test module or a conftest."""
    problems = [f"top-level {top}" for top in sorted({n.split("/")[0] for n in names})
                if top != "scalegnn" and not top.endswith(".dist-info")]
    return problems + [n for n in names if n.rpartition("/")[2] == "conftest.py"
                       or (n.rpartition("/")[2].startswith("test_") and n.endswith(".py"))]


def test_the_wheel_holds_only_the_scalegnn_package_and_no_tests(tmp_path):
    """Build the wheel (setuptools' PEP 517 backend, about a second) from a copy of what
    pyproject.toml packages, and read its file list."""
    import shutil
    import subprocess
    import sys
    import zipfile

    import pytest

    import scalegnn

    pytest.importorskip("setuptools", minversion="68")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                           "build_meta.build_wheel(sys.argv[1])", str(tmp_path / "dist")],
                          cwd=src, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))).namelist()
    assert _wheel_problems(names) == []
    assert {f"scalegnn/{n}/__init__.py" for n in scalegnn._HARNESS} <= set(names)
    assert "scalegnn/baselines/distdgl/__init__.py" in names and "scalegnn/sweeps/specs/fig5_ablation.toml" in names


def test_the_boundary_checks_can_fail(tmp_path):
    """A checkout whose scalegnn/__init__.py appends the repository to __path__ (the old
    way) leaks tests/ and results/; a wheel file list with a test module or a second
    top-level name is caught."""
    root = tmp_path / "checkout"
    for name in ("tests", "results", *PACKAGES):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    init = (ROOT / "scalegnn" / "__init__.py").read_text()
    (root / "scalegnn" / "__init__.py").write_text(init)
    assert _boundary_problems(root, tmp_path) == []  # the copy is sound
    (root / "scalegnn" / "__init__.py").write_text(init + "\n__path__.append(_CHECKOUT)\n")
    assert _boundary_problems(root, tmp_path) == ["scalegnn.results imports", "scalegnn.tests imports"]
    assert _wheel_problems(["scalegnn/__init__.py", "scalegnn/benchmarks/test_step.py", "scalegnn/x/conftest.py",
                            "tests/__init__.py", "scalegnn-0.1.0.dist-info/RECORD"]) \
        == ["top-level tests", "scalegnn/benchmarks/test_step.py", "scalegnn/x/conftest.py"]


def test_the_micro_benchmarks_run_only_where_m_names_bench():
    """tests/benchmarks/ (pytest-benchmark) is in testpaths but never in `make test`
    (addopts' -m), nor under another -m (one that replaces addopts'); `make bench`'s
    -m bench selects exactly them."""
    import os
    import subprocess
    import sys

    def collected(*args: str) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               *args, "tests/benchmarks"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]  # 5: none selected
        return [line for line in proc.stdout.splitlines() if line.startswith("tests/benchmarks/")]

    assert collected() == [] and collected("-m", "not gpu") == []
    selected = collected("-m", "bench")
    assert len(selected) >= 3 and {s.split("::")[0] for s in selected} == \
        {str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "benchmarks").glob("test_*.py")}
