"""ScaleGNN: mini-batch GCN training with communication-free uniform vertex sampling
and 4D (data x 3D parallel matrix multiplication) parallelism.

The public API (loaded on first use, so ``import scalegnn`` stays light)::

    scalegnn.train(graph_or_none, **settings) -> TrainResult   (scalegnn.api: .record, .model, .predict)
    scalegnn.load_model(file), scalegnn.predict(model, graph), scalegnn.export_checkpoint(dir, file)
    scalegnn.Graph, scalegnn.Graph.from_pyg(data), graph.to_pyg(), Graph.from_dgl(g)
    scalegnn.RunConfig, scalegnn.make_config(**settings), scalegnn.load_dataset(name)
"""

__version__ = "0.1.0"

import warnings

# CSR tensors are the fastest SpMM path on CPU; their "beta" warnings are noise for users.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")

__all__ = ["train", "Graph", "RunConfig", "make_config", "load_dataset", "load_model", "predict",
           "export_checkpoint", "TrainResult", "__version__"]

# The harness lives beside this package in the repository and is installed inside it
# (scalegnn.analysis, ...: pyproject.toml's package-dir maps these folders), so that pip adds
# no top-level names. Exactly these folders are scalegnn's subpackages, never tests/,
# results/ or docs/; tests/harness/test_architecture.py keeps this list equal to pyproject.toml's.
_HARNESS = ("analysis", "baselines", "sweeps", "benchmarks")

import os as _os
import sys as _sys


def _checkout() -> str | None:
    """The repository this package sits in (its pyproject.toml names the project), else
    None: an installed package's parent is site-packages, where other projects' folders
    (a PyPI ``sweeps``) must not become scalegnn's."""
    root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    try:
        with open(_os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
            return root if 'name = "scalegnn"' in f.read() else None
    except OSError:
        return None


class _CheckoutFinder:
    """Run from a checkout (an editable install, or ``PYTHONPATH=<checkout>`` with no
    install, as on a GPU node), the modules of that checkout's scalegnn package:
    ``scalegnn.<folder>`` for each _HARNESS folder (as the installed package holds them),
    every other ``scalegnn.*`` module through its parent's ``__path__`` (``scalegnn.graph``,
    ``scalegnn.baselines.distdgl``), and nothing else: ``scalegnn.tests`` is no module, and
    a name this checkout lacks is not taken from an editable install of another checkout
    (whose finder comes after this one: it stands first in ``sys.meta_path``)."""

    def __init__(self, root: str):
        self.scalegnn_checkout = root

    def find_spec(self, fullname, path=None, target=None):
        root = self.scalegnn_checkout
        if not fullname.startswith("scalegnn.") or not path \
                or not all(_os.path.abspath(p).startswith(root + _os.sep) for p in path):
            return None  # not a submodule of this checkout's scalegnn
        from importlib.machinery import PathFinder

        parent, _, name = fullname.rpartition(".")
        spec = PathFinder.find_spec(fullname, [root] if parent == "scalegnn" and name in _HARNESS else path)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return spec


_CHECKOUT = _checkout()
if _CHECKOUT is not None and all(getattr(f, "scalegnn_checkout", None) != _CHECKOUT for f in _sys.meta_path):
    _sys.meta_path.insert(0, _CheckoutFinder(_CHECKOUT))


def __getattr__(name: str):
    """The API's names, imported when first asked for (PEP 562)."""
    if name == "train":
        from .api import train as value
    elif name == "Graph":
        from .graph import Graph as value
    elif name in ("RunConfig", "make_config"):
        from . import config

        value = getattr(config, name)
    elif name == "load_dataset":
        from .datasets import load_dataset as value
    elif name in ("load_model", "predict", "export_checkpoint", "TrainResult"):
        from . import trained

        value = getattr(trained, name)
    else:
        raise AttributeError(f"module 'scalegnn' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *__all__})
