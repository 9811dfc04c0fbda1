"""The Python API: what ``scalegnn train`` does, as one call from a script or a notebook.

    import scalegnn

    result = scalegnn.train(data, epochs=50, hidden=128)   # a PyG Data, a Graph, or a dataset name
    result["summary"]["test_acc_at_best_val"]              # the run record
    logits = result.predict(data)                           # result.model: the trained ScaleGNN

Settings are the fields of :class:`scalegnn.config.RunConfig` by their own names
(``results/README.md``, "Settings"), exactly what the flags of ``scalegnn train`` set.
"""

from __future__ import annotations

from .config import RunConfig, make_config
from .graph import Graph, as_graph  # noqa: F401 - scalegnn.api.as_graph, as before
from .trained import MODEL_SYSTEMS, TrainResult

__all__ = ["train", "as_graph"]


def train(graph=None, *, config: RunConfig | None = None, **settings) -> TrainResult | None:
    """Train one configuration and return its :class:`~scalegnn.trained.TrainResult`: the
    run record (``result.record``, also written under ``out_dir``, default
    ``results/runs``; the result reads as that record too: ``result["summary"]``), the
    trained model consolidated from the ranks (``result.model``, a plain module on the
    CPU) and ``result.predict(graph)``.

    ``graph``: a :class:`Graph`, a PyG ``Data``, a DGL graph, or None to load ``dataset``
    (``dataset="facebook", data_root=...``; generators such as ``"csbm:n=10000"``).
    The configuration is ``config``, or ``settings`` by field name
    (:func:`scalegnn.config.make_config`: ``epochs=50, batch_ratio=0.1,
    grid=(1, 2, 2, 1), nproc=4, device="cuda", system="graphsage"``...). A graph
    object is recorded under ``dataset`` when given, else under its own name.
    ScaleGNN's systems write their model beside the record unless ``save_model=False``
    (with ``config=``, as the config says).
    Returns None on ranks other than 0 of a job a launcher started (torchrun, srun).
    """
    from .launch import launch

    if config is not None and settings:
        raise ValueError(f"pass either config= or settings, not both (got config and {sorted(settings)})")
    if config is None:
        g = as_graph(graph, name=settings.get("dataset"), seed=settings.get("seed", 0)) if graph is not None else None
        if g is not None:
            settings.setdefault("dataset", g.name)
        if settings.get("system", "scalegnn") in MODEL_SYSTEMS:
            settings.setdefault("save_model", True)  # result.model
        config = make_config(**settings)
    else:  # the configuration's seed splits a graph that has no split of its own, as settings' would
        g = as_graph(graph, name=config.data.dataset, seed=config.seed) if graph is not None else None
    record = launch(config, g)  # each system prepares the graph its own way (ScaleGNN normalizes it)
    return None if record is None else TrainResult(record)
