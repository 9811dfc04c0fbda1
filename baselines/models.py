"""The baselines' models, built from PyTorch Geometric layers.

Shape legend: n nodes of a (sub)graph, F input features, H hidden, C classes,
E edges ``edge_index`` (2, E) with row 0 the source j and row 1 the target i.

Sparse input features. Facebook (0.3 % dense) and other bag-of-words inputs are
kept as CSR (as ScaleGNN does). PyG convolutions take dense inputs, so the *first*
layer uses linearity to project before aggregating, which is the same function:

    SAGEConv:  W_l mean_j x_j + b + W_r x_i  = mean_j (x_j W_l^T) + b + x_i W_r^T
    GCNConv:   sum_j a_ij (x_j W)  (PyG already projects first)
    GraphConv: W_rel sum_j w_ij x_j + b + W_root x_i = sum_j w_ij (x_j W_rel^T) + b + x_i W_root^T

:class:`InputConv` holds the real PyG layer (its parameters and, for dense input,
its forward) and computes the projected form for CSR input; a test checks that
both give the layer's output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["InputConv", "SAGENet", "SAINTNet", "make_conv", "graph_edge_index", "FullGraphModel"]


def graph_edge_index(graph) -> torch.Tensor:
    """PyG's (2, E) ``[source; target]`` of a raw graph's stored entries, self loops left
    out (the raw graph has none; a user's may): what the baselines aggregate over."""
    rows = graph.row_ids()
    keep = rows != graph.indices
    return torch.stack([graph.indices[keep], rows[keep]])


class FullGraphModel(nn.Module):
    """A compared system's model that a run saves and ``scalegnn.predict`` runs on a whole
    graph: ``architecture`` (its constructor's arguments, saved in the model file) and
    :meth:`logits`, exact full-graph inference on a raw graph (every neighbour: the
    sampled systems' neighbour sampling is for training speed, not part of the model)."""

    architecture: dict

    def logits(self, graph) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def inputs(graph) -> tuple[torch.Tensor, torch.Tensor]:
        """(features as training reads them, CSR when sparse; :func:`graph_edge_index`)."""
        from scalegnn.sampling import training_features

        if graph.meta.get("normalized"):
            raise ValueError("predict takes the raw graph (as scalegnn.Graph.from_pyg or load_dataset gives it); "
                             "a compared system normalizes it its own way")
        return training_features(graph.x), graph_edge_index(graph)


def make_conv(kind: str, in_dim: int, out_dim: int):
    from torch_geometric.nn import GCNConv, GraphConv, SAGEConv

    if kind == "sage":
        return SAGEConv(in_dim, out_dim, aggr="mean")
    if kind == "gcn":
        return GCNConv(in_dim, out_dim, add_self_loops=True, normalize=True)
    if kind == "graphconv":
        return GraphConv(in_dim, out_dim, aggr="add")
    raise ValueError(f"unknown convolution {kind!r}; choose sage, gcn or graphconv")


def _sparse_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (n, F) CSR or dense times weight^T (F, H) -> (n, H) dense."""
    if x.layout == torch.strided:
        return x @ weight.t()
    return torch.sparse.mm(x, weight.t().contiguous())


class InputConv(nn.Module):
    """A PyG convolution that also accepts CSR input features (see the module docstring)."""

    def __init__(self, kind: str, in_dim: int, out_dim: int):
        super().__init__()
        self.kind = kind
        self.conv = make_conv(kind, in_dim, out_dim)

    def forward(self, x, edge_index, edge_weight=None, num_dst: int | None = None):
        conv = self.conv
        if x.layout == torch.strided:
            if self.kind == "sage":
                return conv(x, edge_index)
            return conv(x, edge_index, edge_weight)
        if self.kind == "sage":
            pl = _sparse_mm(x, conv.lin_l.weight)
            out = conv.propagate(edge_index, x=(pl, pl), size=None)
            out = out + conv.lin_l.bias
            return out + _sparse_mm(x, conv.lin_r.weight)
        if self.kind == "gcn":
            from torch_geometric.nn.conv.gcn_conv import gcn_norm

            normed = gcn_norm(edge_index, edge_weight, x.shape[0], False, True, "source_to_target", x.dtype)
            ei, w = normed if isinstance(normed, tuple) else (normed, None)  # a SparseTensor comes back alone
            xw = _sparse_mm(x, conv.lin.weight)
            out = conv.propagate(ei, x=xw, edge_weight=w, size=None)
            return out + conv.bias if conv.bias is not None else out
        if self.kind == "graphconv":
            pr = _sparse_mm(x, conv.lin_rel.weight)
            out = conv.propagate(edge_index, x=(pr, pr), edge_weight=edge_weight, size=None)
            out = out + conv.lin_rel.bias
            return out + _sparse_mm(x, conv.lin_root.weight)
        raise AssertionError(self.kind)


class SAGENet(FullGraphModel):
    """GraphSAGE (SALIENT++ / PyG ``graph_sage`` setup): L convolutions, ReLU and dropout between.

    ``conv`` = ``sage`` (SAGEConv, mean aggregation) or ``gcn`` (GCNConv). The last
    layer maps to C classes. Works on a full graph and on a NeighborLoader subgraph
    (seeds first: the caller keeps the first ``batch_size`` rows).
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float, conv: str = "sage"):
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.first = InputConv(conv, dims[0], dims[1])
        self.convs = nn.ModuleList(make_conv(conv, dims[i], dims[i + 1]) for i in range(1, layers))
        self.kind, self.dropout = conv, dropout
        self.architecture = dict(in_dim=in_dim, hidden=hidden, out_dim=out_dim, layers=layers, dropout=dropout,
                                 conv=conv)

    @property
    def num_layers(self) -> int:
        return 1 + len(self.convs)

    def layer(self, i: int, x, edge_index):
        """Layer i alone (for layer-wise inference); i = 0 accepts CSR input."""
        h = self.first(x, edge_index) if i == 0 else self.convs[i - 1](x, edge_index)
        if i < self.num_layers - 1:
            h = F.dropout(F.relu(h), p=self.dropout, training=self.training)
        return h

    def forward(self, x, edge_index):
        h = x
        for i in range(self.num_layers):
            h = self.layer(i, h, edge_index)
        return h

    def logits(self, graph) -> torch.Tensor:
        """Every vertex, every neighbour (``--eval-mode layerwise``'s exact inference)."""
        return self(*self.inputs(graph))


class SAINTNet(FullGraphModel):
    """GraphSAINT's GCN (PyG ``examples/graph_saint.py``): L GraphConv layers with
    ReLU and dropout, their outputs concatenated (jumping knowledge) and a linear head.

    Training on a GraphSAINT subgraph uses aggregation weights
    ``edge_norm * 1/deg_in`` (GraphSAINT's alpha normalization); full-graph
    evaluation uses ``1/deg_in`` alone (a mean).
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float):
        super().__init__()
        self.first = InputConv("graphconv", in_dim, hidden)
        self.convs = nn.ModuleList(make_conv("graphconv", hidden, hidden) for _ in range(layers - 1))
        self.head = nn.Linear(layers * hidden, out_dim)
        self.dropout = dropout
        self.architecture = dict(in_dim=in_dim, hidden=hidden, out_dim=out_dim, layers=layers, dropout=dropout)

    def forward(self, x, edge_index, edge_weight):
        outs = []
        h = self.first(x, edge_index, edge_weight)
        for conv in [None, *self.convs]:
            if conv is not None:
                h = conv(h, edge_index, edge_weight)
            h = F.dropout(F.relu(h), p=self.dropout, training=self.training)
            outs.append(h)
        return self.head(torch.cat(outs, dim=-1))

    def logits(self, graph) -> torch.Tensor:
        """The full-graph evaluation of GraphSAINT: every neighbour, weights ``1/deg_in``."""
        x, edge_index = self.inputs(graph)
        target = edge_index[1]
        deg = torch.bincount(target, minlength=graph.num_nodes).clamp(min=1).to(torch.float32)
        return self(x, edge_index, 1.0 / deg[target])
