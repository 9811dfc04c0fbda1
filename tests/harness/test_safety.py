"""No unsafe deserialization anywhere, and no executed specs: a property of the whole tree,
not of one module, so it is checked beside the architecture test (tests/harness/
test_architecture.py), which reads the same sources.

Every torch.load passes weights_only=True; no eval/exec/compile/runpy/yaml.load
anywhere; pickle and np.load(allow_pickle=True) only where reviewed (ALLOWED); an
Unpickler only with its own find_class (the restricted one in
scalegnn/datasets/safe_pickle.py, whose refusals are tested in
tests/unit/datasets/test_safe_pickle.py). Sweep specs and system tables are TOML read by
tomllib: data, never code.
"""

from __future__ import annotations

import ast

from tests.files import REPO


# ----------------------------------------------------------------------------- safety
def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f"{getattr(f.value, 'id', '?')}.{f.attr}" \
                if isinstance(f, ast.Attribute) else "?"
            yield name, node


# Reviewed exceptions. Third-party pickles (Planetoid, LINKX, ogb) are no longer among
# them: scalegnn/datasets/safe_pickle.py reads them with a restricted unpickler.
ALLOWED = {
    ("scalegnn/launch/job.py", "pickle.loads"): "results from this process's own workers, over a pipe",
}


def _unrestricted_unpicklers(tree):
    """Subclasses of pickle.Unpickler that do not override find_class (which would
    resolve any global, like pickle.load), and direct pickle.Unpickler(...) calls."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b) in ("pickle.Unpickler", "Unpickler")
                                                  for b in node.bases):
            if not any(isinstance(f, ast.FunctionDef) and f.name == "find_class" for f in node.body):
                yield node.lineno, f"class {node.name}(pickle.Unpickler) without find_class"
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "pickle.Unpickler":
            yield node.lineno, "pickle.Unpickler(...) without a restricted find_class"


def test_no_unsafe_deserialization_and_no_executed_specs():
    """Every torch.load passes weights_only=True; no eval/exec/compile/runpy/yaml.load
    anywhere; pickle and np.load(allow_pickle=True) only where reviewed (ALLOWED); an
    Unpickler only with its own find_class (the restricted one in safe_pickle.py).
    Sweep specs and system tables are TOML read by tomllib: data, never code."""
    problems = []
    files = [p for d in ("scalegnn", "analysis", "sweeps", "baselines", "benchmarks") if (REPO / d).is_dir()
             for p in sorted((REPO / d).rglob("*.py"))]
    assert files
    for path in files:
        rel = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text(), filename=rel)
        problems += [f"{rel}:{line} {what}" for line, what in _unrestricted_unpicklers(tree)]
        for name, call in _calls(tree):
            kw = {k.arg: k.value for k in call.keywords}
            if name in ("eval", "exec", "compile", "__import__") or name.startswith("runpy.") or name == "yaml.load":
                problems.append(f"{rel}:{call.lineno} {name}")
            elif name == "torch.load":
                ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
                if not ok and (rel, name) not in ALLOWED:
                    problems.append(f"{rel}:{call.lineno} torch.load without weights_only=True")
            elif name in ("pickle.load", "pickle.loads", "cloudpickle.load", "dill.load") \
                    and (rel, name) not in ALLOWED:
                problems.append(f"{rel}:{call.lineno} {name}")
            elif name == "np.load" and isinstance(kw.get("allow_pickle"), ast.Constant) \
                    and kw["allow_pickle"].value is True and (rel, name) not in ALLOWED:
                problems.append(f"{rel}:{call.lineno} np.load(allow_pickle=True)")
    assert not problems, problems
    for spec in list((REPO / "sweeps").rglob("*.toml")):
        import tomllib

        tomllib.loads(spec.read_text())  # plain data that parses as TOML
