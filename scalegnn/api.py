"""The Python API: what ``scalegnn train`` does, as one call from a script or a notebook.

    import scalegnn

    record = scalegnn.train(data, epochs=50, hidden=128)   # a PyG Data, a Graph, or a dataset name
    record["summary"]["test_acc_at_best_val"]

Settings are the fields of :class:`scalegnn.config.RunConfig` by their own names
(``results/README.md``, "Settings"), exactly what the flags of ``scalegnn train`` set.
"""

from __future__ import annotations

from .config import RunConfig, make_config
from .graph import Graph

__all__ = ["train", "as_graph"]


def as_graph(graph, *, name: str | None = None, seed: int = 0) -> Graph:
    """A scalegnn :class:`~scalegnn.graph.Graph` from a Graph (as is), a PyTorch
    Geometric ``Data`` (:meth:`Graph.from_pyg`) or a DGL graph (:meth:`Graph.from_dgl`):
    their masks, else a seeded random split."""
    if isinstance(graph, Graph):
        return graph
    if hasattr(graph, "edge_index"):  # torch_geometric.data.Data or anything shaped like it
        return Graph.from_pyg(graph, name=name or "pyg", seed=seed)
    if hasattr(graph, "ndata") and hasattr(graph, "edges"):  # a dgl.DGLGraph (features ndata["feat"], labels ["label"])
        return Graph.from_dgl(graph, name=name or "dgl", seed=seed)
    raise TypeError(f"cannot train on a {type(graph).__name__}: pass a scalegnn Graph, a PyG Data, a DGL graph, or "
                    "a dataset name (dataset=...)")


def train(graph=None, *, config: RunConfig | None = None, **settings) -> dict | None:
    """Train one configuration and return its run record (also written under
    ``out_dir``, default ``results/runs``).

    ``graph``: a :class:`Graph`, a PyG ``Data``, a DGL graph, or None to load ``dataset``
    (``dataset="facebook", data_root=...``; generators such as ``"csbm:n=10000"``).
    The configuration is ``config``, or ``settings`` by field name
    (:func:`scalegnn.config.make_config`: ``epochs=50, batch_ratio=0.1,
    grid=(1, 2, 2, 1), nproc=4, device="cuda", system="graphsage"``...). A graph
    object is recorded under ``dataset`` when given, else under its own name.
    Returns None on ranks other than 0 of a job a launcher started (torchrun, srun).
    """
    from .launch import launch

    if config is not None and settings:
        raise ValueError(f"pass either config= or settings, not both (got config and {sorted(settings)})")
    if config is None:
        g = as_graph(graph, name=settings.get("dataset"), seed=settings.get("seed", 0)) if graph is not None else None
        if g is not None:
            settings.setdefault("dataset", g.name)
        config = make_config(**settings)
    else:  # the configuration's seed splits a graph that has no split of its own, as settings' would
        g = as_graph(graph, name=config.data.dataset, seed=config.seed) if graph is not None else None
    return launch(config, g)  # each system prepares the graph its own way (ScaleGNN normalizes it)
