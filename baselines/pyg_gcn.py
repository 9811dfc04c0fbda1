"""``pyg-gcn``: PyG's full-batch GCN, the plain peer of a time-to-accuracy comparison.

Kipf & Welling's GCN as PyG trains it on one device (the OGB node-property GCN
examples): L ``GCNConv`` layers with bias, ReLU and dropout between them, Adam, one
optimizer step per epoch on the whole graph. The adjacency is normalized once,
``D^-1/2 (A + I) D^-1/2`` (:meth:`scalegnn.graph.Graph.gcn_normalize`, the same matrix
as PyG's ``gcn_norm`` and as ScaleGNN's), and kept as a sparse CSR ``adj_t`` (symmetric,
so its own transpose), which each ``GCNConv(normalize=False)`` multiplies: one SpMM
per layer and no per-step normalization, PyG's fast full-batch path.

Shapes: N vertices, F features (dense or CSR), H hidden, C classes. A CSR input
(bag-of-words features) is projected first, ``A (X W) + b``, the same function
(``models.InputConv``'s identity).

One process: the whole graph is on one device. Full-graph training on several ranks
is ``fullgraph-3d``, ``bns-gcn`` or ``cagnet-*``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from scalegnn.config import RunConfig
from scalegnn.device import synchronize, to_device
from .common import BaselineData, DataParallelTrainer, EpochStats, baseline_data, step_on_labeled_rows
from .graphsage import split_accuracies_local
from .models import FullGraphModel, _sparse_mm

__all__ = ["PyGGCNOptions", "GCN", "PyGGCNTrainer", "make_trainer"]


@dataclass(kw_only=True)
class PyGGCNOptions:
    """No settings of its own: the model's size, dropout and Adam's rate are the common flags."""

    def check_world(self, world: int) -> None:
        if world != 1:
            raise ValueError(f"pyg-gcn trains the whole graph in one process, got {world}; use --nproc 1 "
                             "(full-graph training on several ranks: --system fullgraph-3d, bns-gcn or cagnet-*)")


class GCN(FullGraphModel):
    """L GCNConv layers (bias), ReLU and dropout between them, over a normalized ``adj_t``."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float):
        from torch_geometric.nn import GCNConv

        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.convs = nn.ModuleList(GCNConv(a, b, normalize=False, add_self_loops=False)
                                   for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = dropout
        self.architecture = dict(in_dim=in_dim, hidden=hidden, out_dim=out_dim, layers=layers, dropout=dropout)

    def logits(self, graph) -> torch.Tensor:
        """The whole graph's logits, on its GCN normalization (as training)."""
        x, _ = self.inputs(graph)
        return self(x, graph.gcn_normalize().to_torch_csr())

    def forward(self, x: torch.Tensor, adj_t: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            if x.layout == torch.strided:
                x = conv(x, adj_t)
            else:  # CSR features: A (X W) + b, GCNConv's own order, with a sparse X W
                x = conv.propagate(adj_t, x=_sparse_mm(x, conv.lin.weight), edge_weight=None) + conv.bias
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x


class PyGGCNTrainer(DataParallelTrainer):
    def __init__(self, cfg: RunConfig, data: BaselineData, env):
        self.cfg = cfg
        super().__init__(data, env)
        g = data.graph
        t = time.perf_counter()
        self.adj_t = g.gcn_normalize().to_torch_csr().to(self.device)
        self.preprocess_s = time.perf_counter() - t
        self.x = to_device(data.features, self.device)
        self.y = g.y.to(self.device)
        train = g.train_idx if g.multilabel else g.train_idx[g.y[g.train_idx] >= 0]
        self.train_idx = train.to(self.device)
        self.batch_size, self.steps_per_epoch = g.num_nodes, 1
        torch.manual_seed(cfg.seed)
        self.model = GCN(g.num_features, cfg.model.hidden, g.num_classes, cfg.model.layers,
                         cfg.model.dropout).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)

    def train_epoch(self, epoch: int) -> EpochStats:
        st, comp = EpochStats(), defaultdict(float)
        self.model.train()
        synchronize(self.device)
        t = time.perf_counter()
        step_on_labeled_rows(self.optimizer, self.model(self.x, self.adj_t)[self.train_idx], self.y[self.train_idx],
                             st, comp, t)
        st.components = dict(comp)
        return st

    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        return split_accuracies_local(self.model(self.x, self.adj_t).cpu(), self.data.graph)

    def record_extra(self) -> dict:
        return {"preprocess_s": self.preprocess_s}


def make_trainer(cfg: RunConfig, graph, env) -> PyGGCNTrainer:
    """The trainer (the registry's ``trainer`` of --system pyg-gcn)."""
    return PyGGCNTrainer(cfg, baseline_data(cfg, graph), env)
