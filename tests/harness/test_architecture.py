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

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("scalegnn", "baselines", "sweeps", "analysis", "benchmarks")  # folders; all import as scalegnn.*

# Lowest first. An entry names one module, or with ".*" a package and every module in it;
# the longest match decides a module's floor, and a module that matches none has none.
FLOORS = [
    ("foundations", ["scalegnn.fileio", "scalegnn.device", "scalegnn.ranges", "scalegnn.settings",
                     "scalegnn.csr", "scalegnn.graph", "scalegnn.records", "scalegnn.progress", "scalegnn._numba",
                     "scalegnn._sampling_kernel", "scalegnn._elementwise", "scalegnn._compiled",
                     "scalegnn.datasets.*", "scalegnn.sampling", "scalegnn.systems", "scalegnn.signals",
                     "scalegnn.threads", "scalegnn.timing", "scalegnn.metrics",
                     "scalegnn.rowsparse", "scalegnn.functional",
                     # the run configuration's sections, declared where no torch loads (imported by their owners)
                     "scalegnn.sections", "scalegnn.sections.*"]),
    # Where a process stands in a run and its local workers: threads, signals and devices only.
    ("process launch", ["scalegnn.launch.environment", "scalegnn.launch.job", "scalegnn.launch.liveness"]),
    # The parallel core: below every application component, so none of them leaks into it.
    ("parallel grid", ["scalegnn.parallel", "scalegnn.parallel.grid"]),
    ("parallel collectives", ["scalegnn.parallel.collectives", "scalegnn.parallel.layout"]),
    ("parallel context", ["scalegnn.parallel.context"]),
    ("parallel operators", ["scalegnn.parallel.products", "scalegnn.parallel.tail", "scalegnn.parallel.losses"]),
    ("components", ["scalegnn.permutation", "scalegnn.model", "scalegnn.numerics", "scalegnn.perf", "scalegnn.optim",
                    "scalegnn.checkpoint", "scalegnn.loop"]),
    # The parallel application: the core put to work on the components' model and data.
    ("parallel data", ["scalegnn.parallel.sharding", "scalegnn.parallel.dist_sampling"]),
    # Shard sets on disk: written in memory or out of core (reading the datasets' folders), mapped
    # back by a rank. Above the shard it cuts and the datasets, below the engine and the trainer.
    ("shard files", ["scalegnn.shards", "scalegnn.shards.*"]),
    ("parallel model", ["scalegnn.parallel.model", "scalegnn.parallel.step_graph"]),
    ("parallel engine", ["scalegnn.parallel.engine"]),
    ("trainers", ["scalegnn.config", "scalegnn.trained", "scalegnn.trainer", "scalegnn.session", "scalegnn.launch",
                  "scalegnn.perfmodel",
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
    assert floor_of("scalegnn.parallel.engine") > floor_of("scalegnn.shards.out_of_core") \
        > floor_of("scalegnn.parallel.sharding") and floor_of("scalegnn.shards") > floor_of("scalegnn.datasets.files")
    assert floor_of("scalegnn.parallel.unlisted") is None and floor_of("scalegnn.unlisted") is None
    assert "scalegnn.sections.parallel" in GRAPH["scalegnn.config"]  # imports are really read
    assert _resolve("scalegnn.parallel.grid.cube_3d") == "scalegnn.parallel.grid"


# --------------------------------------------------------------------------- the shard files' contract
SHARD_PACKAGE = "scalegnn.shards"
SHARD_MODULES = ("scalegnn.shards", "scalegnn.parallel.sharding")  # and every module of the package
SHARD_FILE_TEXT = ("manifest.json", "shard_x", ".verified")  # what only the package's names spell
SHARD_INSIDE_NAMES = ("MANIFEST",)  # public in the package, for its own modules: outside, has_manifest/read_manifest


def _module_names(module: str, tree: ast.AST, is_package: bool) -> tuple[dict[str, str], list[tuple]]:
    """({local name: the dotted name it is bound to} of every import in ``tree``, [(line,
    dotted name) of every name imported with ``from``]), relative imports resolved from
    ``module`` (a package's ``__init__`` when ``is_package``)."""
    package = module if is_package else module.rpartition(".")[0]
    bound, imported = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                imported.append((node.lineno, f"{base}.{alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    bound[root] = root
    return bound, imported


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _shard_contract_breaches(module: str, source: str, is_package: bool = False) -> list[str]:
    """Where ``source`` (the code of ``module``, outside the shard package) reaches past the
    shard files' public names: a string spelling a shard file's name (outside docstrings:
    the code that opens it), or a private name (``_x``) or the package's own ``MANIFEST``
    of scalegnn.shards or scalegnn.parallel.sharding, imported or read as an attribute
    (through any alias of the module or of a package above it)."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    bound, imported = _module_names(module, tree, is_package)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and any(s in node.value for s in SHARD_FILE_TEXT):
            out.append(f"{module}:{node.lineno} spells a shard file's name ({node.value[:40]!r})")
    for line, dotted in imported:
        owner, _, name = dotted.rpartition(".")
        if owner.startswith(SHARD_MODULES) and (_private(name) or name in SHARD_INSIDE_NAMES):
            out.append(f"{module}:{line} imports {dotted}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (_private(node.attr) or node.attr in SHARD_INSIDE_NAMES):
            root, _, rest = ast.unparse(node.value).partition(".")
            owner = ".".join(filter(None, (bound.get(root, ""), rest))) if root in bound else ""
            if owner.startswith(SHARD_MODULES):
                out.append(f"{module}:{node.lineno} reads {owner}.{node.attr}")
    return out


def _reaches_out_of_the_shards(module: str, source: str, is_package: bool = False) -> list[str]:
    """Private names a module of the shard package imports from outside it (a ``_x``
    name, or any name of a private module such as ``datasets._core``)."""
    _, imported = _module_names(module, ast.parse(source), is_package)
    return [f"{module}:{line} imports {dotted}" for line, dotted in imported
            if dotted.startswith("scalegnn.") and not dotted.startswith(SHARD_PACKAGE + ".")
            and any(_private(part) for part in dotted.split("."))]


def _outside(module: str) -> bool:
    return module != SHARD_PACKAGE and not module.startswith(SHARD_PACKAGE + ".")


def test_only_the_shard_package_knows_the_files():
    """No module outside scalegnn.shards opens a shard manifest, spells a shard file's name
    or names a private helper of the shards (scalegnn.shards.*, scalegnn.parallel.sharding):
    the file names, the manifest and the checks are read through the package's public
    names. And the package itself reads the datasets and the parallel core through their
    public names only."""
    breaches = [b for module, path in sorted(MODULES.items())
                if _outside(module) and module != "scalegnn.parallel.sharding"
                for b in _shard_contract_breaches(module, path.read_text(), path.name == "__init__.py")]
    breaches += [b for module, path in sorted(MODULES.items()) if not _outside(module)
                 for b in _reaches_out_of_the_shards(module, path.read_text(), path.name == "__init__.py")]
    assert {m for m in MODULES if not _outside(m)} >= {"scalegnn.shards.format", "scalegnn.shards.out_of_core"}
    assert not breaches, "\n".join(breaches)


def test_the_shard_contract_check_can_fail():
    """Each kind of breach, planted, is found; the public names and a docstring are not."""
    planted = {
        'import json\nm = json.loads(open(f"{d}/manifest.json").read())': ["spells a shard file's name"],
        'p = folder / f"shard_x{i}_y{j}_z{k}.pt"': ["spells a shard file's name"],
        "from scalegnn.parallel.sharding import _mp_coords": ["imports scalegnn.parallel.sharding._mp_coords"],
        "from ..shards.format import _load_blocks": ["imports scalegnn.shards.format._load_blocks"],
        "from .sharding import _check_shape": ["imports scalegnn.parallel.sharding._check_shape"],  # in parallel/
        "from scalegnn.shards import MANIFEST": ["imports scalegnn.shards.MANIFEST"],
        "import scalegnn.shards.out_of_core as ooc\nooc._Source": ["reads scalegnn.shards.out_of_core._Source"],
        "from scalegnn.shards import format as f\nf._rank_keys(1, 2, 3)": ["reads scalegnn.shards.format._rank_keys"],
        "import scalegnn.parallel.sharding\nscalegnn.parallel.sharding._split_masks": [
            "reads scalegnn.parallel.sharding._split_masks"],
        "from scalegnn import shards\nshards.format._load_blocks": ["reads scalegnn.shards.format._load_blocks"],
        "import scalegnn.parallel as p\np.sharding._x": ["reads scalegnn.parallel.sharding._x"],
        "from scalegnn import shards\nd / shards.MANIFEST": ["reads scalegnn.shards.MANIFEST"],
        '"""Reads manifest.json."""\nfrom scalegnn.shards import read_manifest, load_shard\nx.__class__\nshard._x': [],
    }
    for source, want in planted.items():
        module = "scalegnn.parallel.probe" if source.startswith("from .sharding") else "scalegnn.benchmarks.probe"
        found = _shard_contract_breaches(module, source)
        assert len(found) == len(want) and all(w in f for w, f in zip(want, found)), (source, found)
    inside = "from ..datasets._core import draw_split\nfrom ..datasets.files import _byo_split, byo_split\n" \
             "from .format import _load_blocks\nfrom ..parallel.sharding import grid_coords"
    assert _reaches_out_of_the_shards("scalegnn.shards.probe", inside) == [
        "scalegnn.shards.probe:1 imports scalegnn.datasets._core.draw_split",
        "scalegnn.shards.probe:2 imports scalegnn.datasets.files._byo_split"]


def test_no_test_module_imports_another():
    """Shared helpers live in tests/graphs.py, tests/files.py, tests/runs.py and friends,
    and shared fixtures in the conftest.py of the folder that needs them: a test module
    imported by another would run its tests twice and tie the two files together. Every
    folder of tests/ is walked (tests/unit/, tests/parallel/, ...)."""
    tests = ROOT / "tests"
    paths = sorted(tests.rglob("test_*.py"))
    assert {p.parent.name for p in paths} >= {"unit", "datasets", "parallel", "integration", "baselines", "harness"}
    offenders = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)] \
                if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(tests)} imports {n}" for n in names
                          if n.startswith("tests.") and n.rpartition(".")[2].startswith("test_")]
    assert not offenders, "\n".join(offenders)


# --------------------------------------------------------------------------- the package boundary
# From a checkout, exactly the harness folders import as scalegnn.<folder> (scalegnn/__init__.py's
# finder); installed, exactly what pyproject.toml packages: the wheel holds the one top-level name
# `scalegnn` and no test file. tests/, results/, docs/ are never part of the package.

# Run in a fresh interpreter with the checkout (argv[1]) on PYTHONPATH and, where argv[2]
# names one, an editable install of another checkout (setuptools' finder, appended after
# the path finder: it maps scalegnn and that checkout's folders, and their children):
# where each harness name is found, and which names import that must not (the checkout's
# other folders; modules only the other checkout has). find_spec resolves the harness as
# `import` does without running it (no torch, no pandas needed).
_PROBE = """
import importlib, importlib.util, json, os, sys
from importlib.machinery import PathFinder
root, other = sys.argv[1], sys.argv[2]
MAPPING = {"scalegnn." + d: os.path.join(other, d) for d in os.listdir(other) if d != "scalegnn"} | \\
    {"scalegnn": os.path.join(other, "scalegnn")} if other else {}


class EditableInstallOfAnotherCheckout:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in MAPPING:
            return importlib.util.spec_from_file_location(fullname, os.path.join(MAPPING[fullname], "__init__.py"),
                                                          submodule_search_locations=[MAPPING[fullname]])
        parent = fullname.rpartition(".")[0]
        return PathFinder.find_spec(fullname, [MAPPING[parent]]) if parent in MAPPING else None


sys.meta_path.append(EditableInstallOfAnotherCheckout)
import scalegnn
found = {n: getattr(importlib.util.find_spec("scalegnn." + n), "origin", None) for n in scalegnn._HARNESS}
others = [d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and d.isidentifier()]
leaks = []
for n in sorted([d for d in others if d != "scalegnn" and d not in scalegnn._HARNESS] + ["stale", "benchmarks.stale"]):
    try:
        importlib.import_module("scalegnn." + n)
        leaks.append(n)
    except ModuleNotFoundError:
        pass
print(json.dumps({"scalegnn": scalegnn.__file__, "found": found, "leaks": leaks}))
"""


def _boundary_problems(root: Path, cwd: Path, *python_flags: str, other: Path | None = None) -> list[str]:
    """What is wrong with the package boundary of the checkout ``root``, seen by
    ``python <flags>`` started in ``cwd`` with only ``PYTHONPATH=root`` (and, with
    ``other``, an editable install of that checkout in the interpreter)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, *python_flags, "-c", _PROBE, str(root), str(other or "")], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    problems = [] if seen["scalegnn"] == str(root / "scalegnn" / "__init__.py") else [f"scalegnn is {seen['scalegnn']}"]
    problems += [f"scalegnn.{n} is {origin}" for n, origin in seen["found"].items()
                 if origin != str(root / n / "__init__.py")]
    return problems + [f"scalegnn.{n} imports" for n in seen["leaks"]]


def _fake_checkout(root: Path, init: str, stale: bool = False) -> Path:
    """A checkout with this pyproject.toml, ``init`` as scalegnn/__init__.py, an empty
    package in each of the folders, tests/ and results/; with ``stale``, a module
    ``stale`` in scalegnn/ and benchmarks/ (what another checkout may have)."""
    for name in ("tests", "results", *PACKAGES):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
    if stale:
        (root / "scalegnn" / "stale.py").write_text("")
        (root / "benchmarks" / "stale.py").write_text("")
    (root / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (root / "scalegnn" / "__init__.py").write_text(init)
    return root


def test_from_a_checkout_exactly_the_harness_folders_import_inside_scalegnn(tmp_path):
    """With only PYTHONPATH=<checkout> (cwd elsewhere), with site-packages (where an
    editable install of another checkout may sit) and without (-S: a bare GPU node), and
    beside an editable install of another checkout that has more modules: each harness
    name is this checkout's folder, and nothing else imports as scalegnn.* (tests/,
    results/, docs/, the other checkout's modules)."""
    assert (ROOT / "tests").is_dir() and (ROOT / "results").is_dir()  # there is something to leak
    other = _fake_checkout(tmp_path / "other", (ROOT / "scalegnn" / "__init__.py").read_text(), stale=True)
    assert _boundary_problems(ROOT, tmp_path) == []
    assert _boundary_problems(ROOT, tmp_path, "-S") == []
    assert _boundary_problems(ROOT, tmp_path, other=other) == []


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
    """Planted in a copy of scalegnn/__init__.py: the repository appended to __path__ (the
    old way) leaks tests/ and results/; the finder appended to sys.meta_path (after an
    editable install of another checkout) loses the harness names to it; a finder that
    lets a missing name fall through takes that checkout's modules. A wheel file list with a
    test module or a second top-level name is caught."""
    init = (ROOT / "scalegnn" / "__init__.py").read_text()
    other = _fake_checkout(tmp_path / "other", init, stale=True)
    raising = 'raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)'
    assert "_sys.meta_path.insert(0, " in init and raising in init
    planted = {"sound": init, "path": init + "\n__path__.append(_CHECKOUT)\n",
               "last": init.replace("_sys.meta_path.insert(0, ", "_sys.meta_path.append("),
               "falls through": init.replace(raising, "return None")}
    seen = {how: _boundary_problems(_fake_checkout(tmp_path / how, text), tmp_path, "-S", other=other)
            for how, text in planted.items()}  # -S: no editable install of this machine's own in the way
    leaked = [f"scalegnn.{n} imports" for n in ("benchmarks.stale", "results", "stale", "tests")]
    assert seen["sound"] == []
    assert seen["path"] == ["scalegnn.results imports", "scalegnn.stale imports", "scalegnn.tests imports"]
    assert seen["last"] == [f"scalegnn.{n} is {other / n / '__init__.py'}" for n in ("analysis", "baselines",
                                                                                    "sweeps", "benchmarks")] + leaked
    assert seen["falls through"] == leaked
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


def test_make_test_gpu_runs_every_file_with_a_gpu_test():
    """`make test-gpu` runs the files the Makefile's GPU_TESTS names (a GPU node collects
    only those, with its own python): every test file with a ``gpu`` test (the marker, or
    a test over tests/devices.py's DEVICES) is named, and no other."""
    import re

    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (listed,) = re.findall(r"^GPU_TESTS\s*\?=\s*(.*)$", text, flags=re.M)
    with_gpu = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                if p != Path(__file__).resolve()  # this file names them, in the search below
                and re.search(r"mark\.gpu\b|^gpu = |\bDEVICES\b", p.read_text(), flags=re.M)}
    assert "tests/parallel/test_engine.py" in with_gpu  # the search finds them
    assert set(listed.split()) == with_gpu
