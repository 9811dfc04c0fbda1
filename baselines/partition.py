"""Vertex partitions for the partition-parallel baselines (``salient``, ``bns-gcn``).

``partition_vertices(graph, parts, method, seed) -> part (N,) int64`` with
``part[v]`` the rank owning vertex v: METIS (pymetis, edge-cut minimizing, the
graph symmetrized, self loops dropped) or uniformly random, balanced.
"""

from __future__ import annotations

import numpy as np
import torch

from scalegnn.graph import Graph

__all__ = ["partition_vertices", "PARTITION_METHODS"]

PARTITION_METHODS = ("metis", "random")


def partition_vertices(graph: Graph, parts: int, method: str = "metis", seed: int = 0) -> torch.Tensor:
    n = graph.num_nodes
    if method not in PARTITION_METHODS:
        raise ValueError(f"partition method must be one of {PARTITION_METHODS}, got {method!r}")
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if parts == 1:
        return torch.zeros(n, dtype=torch.int64)
    if method == "random":
        rng = np.random.default_rng(np.random.SeedSequence([seed, 4242]))
        return torch.from_numpy(rng.permutation(n) % parts).to(torch.int64)
    try:
        import pymetis
    except ImportError as exc:  # pragma: no cover - pymetis is in the [baselines] extra
        raise ValueError("METIS partitioning needs pymetis: pip install 'scalegnn[baselines]' "
                         "or pass --partition random") from exc
    rows = graph.row_ids()
    keep = rows != graph.indices
    src, dst = rows[keep], graph.indices[keep]
    sym = graph.with_edges(torch.cat([src, dst]), torch.cat([dst, src]))  # METIS needs a symmetric graph
    opts = pymetis.Options(seed=int(seed)) if hasattr(pymetis, "Options") else None
    kwargs = {"xadj": sym.indptr.numpy(), "adjncy": sym.indices.numpy()}
    if opts is not None:
        kwargs["options"] = opts
    _, membership = pymetis.part_graph(parts, **kwargs)
    part = torch.as_tensor(np.asarray(membership), dtype=torch.int64)
    # METIS may leave a part empty on tiny graphs: every rank must own something.
    for p in range(parts):
        if not bool((part == p).any()):
            biggest = int(torch.bincount(part, minlength=parts).argmax())
            victims = (part == biggest).nonzero().flatten()
            part[victims[: max(1, victims.numel() // 2)]] = p
    return part
