"""ScaleGNN: mini-batch GCN training with communication-free uniform vertex sampling
and 4D (data x 3D parallel matrix multiplication) parallelism.

The public API (loaded on first use, so ``import scalegnn`` stays light)::

    scalegnn.train(graph_or_none, **settings) -> run record    (scalegnn.api)
    scalegnn.Graph, scalegnn.Graph.from_pyg(data), graph.to_pyg(), Graph.from_dgl(g)
    scalegnn.RunConfig, scalegnn.make_config(**settings), scalegnn.load_dataset(name)
"""

__version__ = "0.1.0"

import warnings

# CSR tensors are the fastest SpMM path on CPU; their "beta" warnings are noise for users.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")

__all__ = ["train", "Graph", "RunConfig", "make_config", "load_dataset", "__version__"]

# The harness lives beside this package in the repository (analysis/, baselines/, sweeps/,
# benchmarks/) and is installed inside it (scalegnn.analysis, ...: pyproject.toml maps the
# folders), so that pip adds no top-level names. Run from a checkout (PYTHONPATH, no
# install), the repository is one more place to look for scalegnn's subpackages.
import os as _os


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


_CHECKOUT = _checkout()
if _CHECKOUT is not None and _CHECKOUT not in __path__:
    __path__.append(_CHECKOUT)

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
    else:
        raise AttributeError(f"module 'scalegnn' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *__all__})
