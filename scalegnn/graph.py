"""The graph container: CSR adjacency, node features, labels and splits.

Shape legend used in this file:
    N   number of vertices          nnz  number of stored adjacency entries
    F   input feature dimension     C    number of classes

The adjacency is square CSR: ``indptr`` (N+1, int64), ``indices`` (nnz, int64,
sorted within each row, no duplicates after :meth:`Graph.coalesced`), ``values``
(nnz, float32). Features ``x`` are (N, F) float32, dense or a torch ``sparse_csr``
tensor (canonical: :func:`scalegnn.csr.csr_matrix`); a sparse ``x`` stays sparse
through every operation here. Labels are either int64 (N,) with -1 for
"unlabeled", or a float32 multi-hot matrix (N, C) for multi-label tasks.

Every operation returns a new :class:`Graph`; a graph is never modified in place,
so a normalized graph can be shared by samplers and evaluators without copies.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from .csr import csr_matrix, is_csr, select_rows

__all__ = ["Graph", "GraphValidationError", "csr_from_edges", "check_split", "as_graph", "split_ids", "edge_weights",
           "undirected_edges"]


# The tensors of the graph a derived one is made from (Graph.replace), already validated:
# a derived graph does not scan them again.
_CHECKED: contextvars.ContextVar[tuple] = contextvars.ContextVar("scalegnn_graph_checked", default=())


class GraphValidationError(ValueError):
    """A graph's arrays are inconsistent; the message names the array and the fix."""


def _as_long(t, name: str) -> torch.Tensor:
    t = torch.as_tensor(t)
    if (t.dtype.is_floating_point or t.dtype == torch.bool) and t.numel():
        raise GraphValidationError(f"{name} must hold integers, got dtype {t.dtype}")
    return t.to(torch.int64).contiguous()


def _as_features(x) -> torch.Tensor:
    """Node features as float32, dense or canonical CSR. A sparse input stays sparse:
    a torch sparse tensor (CSR, COO, CSC), a scipy sparse matrix or a PyG
    ``SparseTensor`` becomes CSR, never a dense (N, F) array."""
    if hasattr(x, "to_torch_sparse_csr_tensor"):  # torch_sparse.SparseTensor (PyG)
        x = x.to_torch_sparse_csr_tensor()
    if not isinstance(x, torch.Tensor) and hasattr(x, "tocsr"):  # scipy.sparse
        m = x.tocsr()
        parts = (m.indptr, m.indices, m.data, m.shape)
    elif isinstance(x, torch.Tensor) and x.layout != torch.strided:
        if x.dim() != 2:
            raise GraphValidationError(f"features must be an (N, F) matrix, got a sparse tensor of shape "
                                       f"{tuple(x.shape)}")
        x = x if is_csr(x) else x.to_sparse_csr()
        parts = (x.crow_indices(), x.col_indices(), x.values(), x.shape)
    else:
        return torch.as_tensor(x).to(torch.float32).contiguous()
    try:
        return csr_matrix(*parts, what="sparse features x")
    except ValueError as exc:
        raise GraphValidationError(str(exc)) from None


def split_ids(given, n: int, name: str) -> torch.Tensor:
    """One split as the caller gave it, read as what it is: a boolean mask of ``n``
    entries (an (n, k) one, PyG's several splits: column 0) gives the vertices it marks,
    an integer tensor gives vertex ids (distinct, in [0, n)); sorted. Anything else, a
    mask of another length or a 0/1 integer mask among them, is refused by name: an
    integer tensor is never taken for a mask, nor a mask for ids."""
    t = torch.as_tensor(given)
    if t.dtype == torch.bool:
        if t.dim() not in (1, 2) or t.shape[0] != n:
            raise GraphValidationError(
                f"{name} is a boolean mask of shape {tuple(t.shape)} but the graph has {n} vertices; a mask needs "
                f"one entry per vertex ({n},), or give the split's vertex ids as an integer tensor")
        return (t if t.dim() == 1 else t[:, 0]).nonzero().flatten()
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dim() != 1:
        raise GraphValidationError(
            f"{name} has dtype {t.dtype} and shape {tuple(t.shape)}; give a boolean mask of {n} entries or a 1-D "
            "integer tensor of vertex ids")
    ids = t.to(torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise GraphValidationError(f"{name} holds vertex ids outside [0, {n}) (read as ids: it is an integer "
                                   "tensor; a mask must be boolean)")
    ids = torch.sort(ids).values
    if ids.numel() > 1 and bool((ids[1:] == ids[:-1]).any()):
        twice = int(ids[1:][ids[1:] == ids[:-1]][0])
        raise GraphValidationError(f"{name} holds vertex id {twice} more than once; an integer tensor is read as "
                                   f"vertex ids: make a 0/1 mask boolean ({name}.bool())")
    return ids


def edge_weights(given, num_edges: int, name: str = "edge_weight") -> torch.Tensor:
    """One float32 weight per edge, finite and >= 0 (a negative degree has no D^-1/2)."""
    w = torch.as_tensor(given)
    if w.dim() == 2 and w.shape[1] == 1:
        w = w.reshape(-1)
    if w.dim() != 1 or w.numel() != num_edges or w.dtype.is_complex:
        raise GraphValidationError(f"{name} must hold one weight per edge, shape ({num_edges},), got "
                                   f"{tuple(w.shape)}")
    w = w.to(torch.float32)
    if not bool(torch.isfinite(w).all()) or (w.numel() and float(w.min()) < 0):
        raise GraphValidationError(f"{name} holds NaN, inf or a negative weight; the GCN normalization D^-1/2 (A+I) "
                                   "D^-1/2 needs finite weights >= 0")
    return w


def undirected_edges(src, dst, num_nodes: int, values=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """The undirected CSR (indptr, indices, values) of an edge list, and whether making
    it undirected added anything (``symmetrized``: some edge was given in one direction
    only, or with another weight the other way).

    Self loops are dropped (GCN normalization adds I once), duplicate pairs merged (a
    weighted pair's weights summed). Unweighted: every edge in both directions, weight
    1. Weighted: the weight of {i, j} is the mean of the weights given for (i, j) and
    (j, i), so an undirected input (each edge both ways, equal weights) stays as it is
    and an edge given one way gets its weight both ways."""
    src, dst = _as_long(src, "edge sources"), _as_long(dst, "edge targets")
    keep = src != dst
    src, dst = src[keep], dst[keep]
    vals = None if values is None else torch.as_tensor(values, dtype=torch.float32)[keep]
    indptr, indices, given = csr_from_edges(src, dst, num_nodes, vals)
    rows = torch.repeat_interleave(torch.arange(num_nodes), indptr[1:] - indptr[:-1])
    t_indptr, t_indices, t_values = csr_from_edges(indices, rows, num_nodes, given)
    if torch.equal(t_indptr, indptr) and torch.equal(t_indices, indices) and torch.equal(t_values, given):
        return indptr, indices, given, False
    both_src, both_dst = torch.cat([rows, indices]), torch.cat([indices, rows])
    if vals is None:
        indptr, indices, weights = csr_from_edges(both_src, both_dst, num_nodes)
        return indptr, indices, weights, True
    indptr, indices, total = csr_from_edges(both_src, both_dst, num_nodes, torch.cat([given, given]))
    _, _, ways = csr_from_edges(both_src, both_dst, num_nodes, torch.ones(2 * given.numel()))
    return indptr, indices, total / ways, True


def check_split(n: int, y: torch.Tensor, train_idx, val_idx, test_idx) -> None:
    """The split's rules for ``n`` vertices labeled ``y``: each part non-empty, ids in
    [0, n), no unlabeled (-1) vertex in train_idx (class ids; a multi-hot ``y`` has no
    -1). :meth:`Graph.validate` applies them, and out-of-core staging to a folder's own split."""
    for split, idx in (("train_idx", train_idx), ("val_idx", val_idx), ("test_idx", test_idx)):
        if idx.numel() == 0:
            raise GraphValidationError(f"{split} is empty; every split needs at least one vertex")
        if int(idx.min()) < 0 or int(idx.max()) >= n:
            raise GraphValidationError(f"{split} holds vertex ids outside [0, {n})")
    if y.dim() == 1 and bool((y[train_idx] < 0).any()):
        raise GraphValidationError("train_idx contains unlabeled vertices (label -1)")


def csr_from_edges(
    src, dst, num_nodes: int, values=None, num_cols: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build sorted CSR arrays (indptr, indices, values) from an edge list.

    Row ``src[k]`` gets an entry in column ``dst[k]``. Duplicate (row, col) pairs
    are merged by summing their values (unweighted input: kept once, weight 1).
    ``num_cols`` defaults to ``num_nodes``; a different value is a non-square
    adjacency and is rejected, because every GCN operator here needs A square.
    """
    num_cols = num_nodes if num_cols is None else num_cols
    if num_cols != num_nodes:
        raise GraphValidationError(
            f"adjacency must be square, got {num_nodes} rows and {num_cols} columns; "
            "a bipartite graph must be converted to a homogeneous one first"
        )
    src = _as_long(src, "edge sources")
    dst = _as_long(dst, "edge targets")
    if src.shape != dst.shape or src.dim() != 1:
        raise GraphValidationError(
            f"edge sources and targets must be 1-D of equal length, got {tuple(src.shape)} and {tuple(dst.shape)}"
        )
    for name, ids in (("edge source", src), ("edge target", dst)):
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
            bad = int(ids.max()) if int(ids.max()) >= num_nodes else int(ids.min())
            raise GraphValidationError(
                f"{name} id {bad} is out of range for a graph with {num_nodes} vertices (valid: 0..{num_nodes - 1})"
            )
    weighted = values is not None
    vals = (
        torch.as_tensor(values, dtype=torch.float32)
        if weighted
        else torch.ones(src.numel(), dtype=torch.float32)
    )
    key = src * num_nodes + dst
    key, order = torch.sort(key, stable=True)
    vals = vals[order]
    uniq, inverse = torch.unique_consecutive(key, return_inverse=True)
    if uniq.numel() != key.numel():
        if weighted:
            merged = torch.zeros(uniq.numel(), dtype=torch.float32)
            vals = merged.index_add_(0, inverse, vals)
        else:
            vals = torch.ones(uniq.numel(), dtype=torch.float32)
    rows = torch.div(uniq, num_nodes, rounding_mode="floor")
    cols = uniq - rows * num_nodes
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(rows, minlength=num_nodes), 0)
    return indptr, cols.contiguous(), vals.contiguous()


@dataclass(frozen=True, eq=False)
class Graph:
    """A square graph in CSR form with node data. Validated on construction."""

    indptr: torch.Tensor
    indices: torch.Tensor
    values: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    num_classes: int
    name: str = "graph"
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        # Normalize dtypes first (frozen dataclass: go through object.__setattr__).
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        put("indptr", _as_long(self.indptr, "indptr"))
        put("indices", _as_long(self.indices, "indices"))
        put("values", torch.as_tensor(self.values, dtype=torch.float32).contiguous())
        put("x", _as_features(self.x))
        y = torch.as_tensor(self.y)
        put("y", y.to(torch.float32 if y.dim() == 2 else torch.int64).contiguous())
        for split in ("train_idx", "val_idx", "test_idx"):
            put(split, _as_long(self.split_tensor(split), split))
        classes = self.num_classes
        if isinstance(classes, bool) or not isinstance(classes, (int, np.integer)) and not (
                isinstance(classes, (float, np.floating)) and float(classes).is_integer()):
            raise GraphValidationError(f"num_classes must be one integer, got {classes!r}")
        put("num_classes", int(classes))
        self.validate()

    def split_tensor(self, split: str) -> torch.Tensor:
        return torch.as_tensor(getattr(self, split))

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise :class:`GraphValidationError` naming the first inconsistency."""
        n = self.indptr.numel() - 1
        if self.indptr.dim() != 1 or n < 1:
            raise GraphValidationError("indptr must be 1-D with at least 2 entries (N+1 for N >= 1 vertices)")
        if int(self.indptr[0]) != 0 or int(self.indptr[-1]) != self.indices.numel():
            raise GraphValidationError(
                f"indptr must start at 0 and end at nnz={self.indices.numel()}, "
                f"got {int(self.indptr[0])} and {int(self.indptr[-1])}"
            )
        if n > 1 and bool((self.indptr[1:] < self.indptr[:-1]).any()):
            raise GraphValidationError("indptr must be non-decreasing")
        if self.values.shape != self.indices.shape:
            raise GraphValidationError(
                f"values has {self.values.numel()} entries but indices has {self.indices.numel()}"
            )
        if not bool(torch.isfinite(self.values).all()):
            raise GraphValidationError("edge values contain NaN or inf; give every edge a finite weight")
        if self.indices.numel():
            lo, hi = int(self.indices.min()), int(self.indices.max())
            if lo < 0 or hi >= n:
                bad = hi if hi >= n else lo
                raise GraphValidationError(
                    f"column index {bad} is out of range for a square adjacency with {n} rows; "
                    "a non-square adjacency or an edge list with ids >= N cannot be used"
                )
        if self.x.dim() != 2 or self.x.shape[0] != n:
            raise GraphValidationError(
                f"features must be an (N, F) matrix with N={n} rows matching the adjacency, got shape {tuple(self.x.shape)}"
            )
        if self.x.shape[1] == 0:
            raise GraphValidationError("features have 0 columns; give at least one feature per vertex (a column of "
                                       "ones when the graph has none)")
        checked = _CHECKED.get()
        # (A CSR x was checked by csr_matrix when it was made: values finite, columns in range.)
        if not is_csr(self.x) and not any(self.x is t for t in checked) and not bool(torch.isfinite(self.x).all()):
            bad = int((~torch.isfinite(self.x)).any(1).nonzero()[0, 0])
            raise GraphValidationError(
                f"features contain NaN or inf (first at vertex {bad}); clean or impute them before training"
            )
        if self.num_classes < 1:
            raise GraphValidationError(f"num_classes must be >= 1, got {self.num_classes}")
        if self.y.shape[0] != n:
            raise GraphValidationError(f"labels have {self.y.shape[0]} rows but the graph has N={n} vertices")
        if self.y.dim() == 1:
            if self.y.numel() and int(self.y.max()) >= self.num_classes:
                raise GraphValidationError(
                    f"label {int(self.y.max())} >= num_classes={self.num_classes}; "
                    "labels must be in [0, num_classes) or -1 for unlabeled"
                )
            if self.y.numel() and int(self.y.min()) < -1:
                raise GraphValidationError(f"label {int(self.y.min())} is invalid; use -1 for unlabeled vertices")
        elif self.y.dim() == 2:
            if not any(self.y is t for t in checked) and not bool(torch.isfinite(self.y).all()):
                raise GraphValidationError("the multi-label matrix holds NaN or inf; its entries must be 0 or 1")
            if self.y.shape[1] != self.num_classes:
                raise GraphValidationError(
                    f"multi-label matrix has {self.y.shape[1]} columns but num_classes={self.num_classes}"
                )
        else:
            raise GraphValidationError(f"labels must be (N,) or (N, C), got shape {tuple(self.y.shape)}")
        check_split(n, self.y, self.train_idx, self.val_idx, self.test_idx)

    def __repr__(self) -> str:
        """One line, as PyG's ``Data``: sizes, not tensors."""
        x = f"{tuple(self.x.shape)}{' sparse' if self.x.layout != torch.strided else ''}"
        y = f"{tuple(self.y.shape)}{' multi-hot' if self.multilabel else ''}"
        split = f"{self.train_idx.numel()}/{self.val_idx.numel()}/{self.test_idx.numel()}"
        normalized = ", normalized" if self.meta.get("normalized") else ""
        return (f"Graph({self.name!r}, num_nodes={self.num_nodes}, num_edges={self.num_edges}, x={x}, y={y}, "
                f"num_classes={self.num_classes}, train/val/test={split}{normalized})")

    # ---------------------------------------------------------- properties
    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    @property
    def num_edges(self) -> int:
        """Stored adjacency entries (an undirected edge counts twice, a self loop once)."""
        return self.indices.numel()

    @property
    def num_features(self) -> int:
        return self.x.shape[1]

    @property
    def multilabel(self) -> bool:
        return self.y.dim() == 2

    def row_ids(self) -> torch.Tensor:
        """Row id of every stored entry (the COO expansion of indptr)."""
        return torch.repeat_interleave(
            torch.arange(self.num_nodes, dtype=torch.int64), self.indptr[1:] - self.indptr[:-1]
        )

    def replace(self, **changes) -> "Graph":
        """A graph with ``changes``; the features and labels it keeps from this graph, whose
        validation they passed, are not scanned again (:meth:`validate` reads each array once
        on the way from a file to a normalized graph)."""
        token = _CHECKED.set(tuple(t for name, t in (("x", self.x), ("y", self.y)) if name not in changes))
        try:
            return dataclasses.replace(self, **changes)
        finally:
            _CHECKED.reset(token)

    def with_edges(self, src, dst, values=None) -> "Graph":
        indptr, indices, vals = csr_from_edges(src, dst, self.num_nodes, values)
        return self.replace(indptr=indptr, indices=indices, values=vals)

    def to_torch_csr(self) -> torch.Tensor:
        n = self.num_nodes
        return torch.sparse_csr_tensor(self.indptr, self.indices, self.values, (n, n))

    def to_scipy(self):
        import scipy.sparse as sp

        n = self.num_nodes
        return sp.csr_matrix((self.values.numpy(), self.indices.numpy(), self.indptr.numpy()), shape=(n, n))

    # --------------------------------------------------------- interchange
    @classmethod
    def from_pyg(cls, data, *, name: str = "pyg", seed: int = 0) -> "Graph":
        """A raw graph (both directions, no self loops: what the loaders return and
        training normalizes) from a PyTorch Geometric ``Data``, trained as passed:

        - ``edge_weight`` (E,) are the edge weights, used by the GCN normalization
          (``D^-1/2 (A+I) D^-1/2`` of the weighted adjacency, as PyG's ``gcn_norm``);
          ``meta["weighted"]`` says so when one differs from 1, and a system that
          cannot use weights refuses the graph. ``edge_attr`` is refused (a feature
          vector per edge, which scalegnn's GCN has no use for): rename it
          ``edge_weight`` (one value per edge) or delete it.
        - A directed ``edge_index`` is made undirected (:func:`undirected_edges`), and
          that is stated: a warning on the ``scalegnn`` logger and ``meta["symmetrized"]``
          with the input's edge count ``meta["input_edges"]``, both in the run record.
        - ``x`` and ``y`` are taken as they are (a sparse ``x``, torch or
          ``SparseTensor``, stays sparse, as CSR; ``y`` (N,) class ids, -1 for
          unlabeled, or (N, C) multi-hot).
        - The split is ``train_mask``/``val_mask``/``test_mask`` when the object has
          them, each a boolean mask (one column of each when they are 2-D, as in PyG's
          multi-split datasets) or an integer tensor of vertex ids (:func:`split_ids`),
          else a seeded random 50/25/25 split of the labeled vertices; ``meta["split"]``
          says which."""
        for attr in ("edge_index", "x", "y"):
            if getattr(data, attr, None) is None:
                raise GraphValidationError(f"the PyG object has no {attr}; scalegnn trains node classification "
                                           "and needs edge_index, x and y")
        edge_attr = getattr(data, "edge_attr", None)
        if edge_attr is not None:
            raise GraphValidationError(
                f"the PyG object has edge_attr of shape {tuple(torch.as_tensor(edge_attr).shape)}, which scalegnn's "
                "GCN would not use: to train on edge weights pass one value per edge as edge_weight "
                "(data.edge_weight = ...), to train unweighted delete it (del data.edge_attr)")
        x, y = _as_features(data.x), torch.as_tensor(data.y)  # a sparse x stays sparse
        n = x.shape[0]
        if y.dim() == 2 and y.shape[1] == 1:
            y = y.reshape(-1)  # ogb-style (N, 1) class ids
        classes = getattr(data, "num_classes", None)
        if not isinstance(classes, int):
            classes = int(y.shape[1]) if y.dim() == 2 else int(y.max()) + 1
        masks = [getattr(data, f"{s}_mask", None) for s in ("train", "val", "test")]
        if all(m is not None for m in masks):
            splits = tuple(split_ids(m, n, f"{s}_mask") for m, s in zip(masks, ("train", "val", "test")))
            several = torch.as_tensor(masks[0]).dim() == 2
            how = "masks of the PyG object" + (" (column 0 of several splits)" if several else "")
        else:
            labeled = None if y.dim() == 2 else (y >= 0).nonzero().flatten().numpy()
            splits = random_split(n, seed=seed, labeled=labeled)
            how = f"random 50/25/25 seed {seed} (the PyG object has no masks)"
        edge_index = torch.as_tensor(data.edge_index)
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise GraphValidationError(f"edge_index must be (2, E), got shape {tuple(edge_index.shape)}")
        given = getattr(data, "edge_weight", None)
        weights = None if given is None else edge_weights(given, edge_index.shape[1])
        if weights is not None and bool((weights == 1).all()):
            weights = None  # all ones: the unweighted graph, which every system trains
        indptr, indices, values, symmetrized = undirected_edges(edge_index[0], edge_index[1], n, weights)
        meta = {"source": type(data).__name__, "split": how}
        if weights is not None:
            meta["weighted"] = True
        if symmetrized:
            meta.update(symmetrized=True, input_edges=int(edge_index.shape[1]))
        graph = cls(indptr, indices, values, x, y, *splits, classes, name=name, meta=meta)
        graph.state_symmetrized()
        return graph

    def to_pyg(self):
        """A PyTorch Geometric ``Data``: ``edge_index`` of the stored entries (with
        ``edge_weight`` when the graph is normalized), ``x`` as the graph holds it (a
        CSR ``x`` stays CSR), ``y`` and boolean masks."""
        from torch_geometric.data import Data

        masks = {}
        for split, idx in (("train", self.train_idx), ("val", self.val_idx), ("test", self.test_idx)):
            mask = torch.zeros(self.num_nodes, dtype=torch.bool)
            mask[idx] = True
            masks[f"{split}_mask"] = mask
        edge_index = torch.stack([self.row_ids(), self.indices])
        weight = {"edge_weight": self.values.clone()} if self.meta.get("normalized") else {}
        return Data(x=self.x, y=self.y, edge_index=edge_index, num_nodes=self.num_nodes, **weight, **masks)

    @classmethod
    def from_edge_index(cls, edge_index, x, y, *, edge_weight=None, train_mask=None, val_mask=None, test_mask=None,
                        num_classes: int | None = None, name: str = "graph", seed: int = 0) -> "Graph":
        """A raw graph from a (2, E) ``edge_index`` (a torch tensor or numpy array: edges
        src -> dst), node features ``x`` (N, F) (dense, or sparse as in :meth:`from_pyg`),
        labels ``y`` ((N,) class ids, -1 unlabeled, or (N, C) multi-hot) and optional
        ``edge_weight`` (E,), as :meth:`from_pyg` makes one: weights used, a directed
        input made undirected and said so, no self loops. The split is the three masks
        when all are given (each a boolean mask of N entries or an integer tensor of
        vertex ids), else a seeded random 50/25/25 split of the labeled vertices."""
        from types import SimpleNamespace

        masks = (train_mask, val_mask, test_mask)
        if any(m is not None for m in masks) and not all(m is not None for m in masks):
            raise GraphValidationError("give train_mask, val_mask and test_mask together, or none of them (a seeded "
                                       "random 50/25/25 split)")
        view = SimpleNamespace(edge_index=torch.as_tensor(edge_index), x=x, y=y, num_classes=num_classes,
                               edge_weight=edge_weight,
                               **({f"{s}_mask": m for s, m in zip(("train", "val", "test"), masks)}
                                  if masks[0] is not None else {}))
        graph = cls.from_pyg(view, name=name, seed=seed)
        split = graph.meta["split"].replace("masks of the PyG object", "the masks given") \
            .replace("the PyG object has no masks", "no masks given")
        return graph.replace(meta={**graph.meta, "source": "edge_index", "split": split})

    @classmethod
    def from_scipy(cls, adjacency, x, y, *, train_mask=None, val_mask=None, test_mask=None,
                   num_classes: int | None = None, name: str = "graph", seed: int = 0) -> "Graph":
        """A raw graph from a scipy sparse adjacency (any format; an entry (i, j) is an
        edge i -> j, its value the edge's weight: a 0/1 matrix is unweighted), as
        :meth:`from_edge_index` makes one."""
        import numpy as np

        if getattr(adjacency, "ndim", None) != 2 or adjacency.shape[0] != adjacency.shape[1]:
            raise GraphValidationError(f"the adjacency must be a square scipy sparse matrix, got shape "
                                       f"{getattr(adjacency, 'shape', None)}")
        coo = adjacency.tocoo()
        graph = cls.from_edge_index(np.stack([coo.row, coo.col]).astype(np.int64), x, y,
                                    edge_weight=torch.from_numpy(np.asarray(coo.data)), train_mask=train_mask,
                                    val_mask=val_mask, test_mask=test_mask, num_classes=num_classes, name=name,
                                    seed=seed)
        return graph.replace(meta={**graph.meta, "source": type(adjacency).__name__})

    @classmethod
    def from_dgl(cls, g, *, feature: str = "feat", label="label", edge_weight: str | None = None, name: str = "dgl",
                 seed: int = 0) -> "Graph":
        """A raw graph from a DGL graph, as :meth:`from_pyg` makes one from a PyG ``Data``
        (the same conversion: weights used, a directed graph made undirected and said
        so, no self loops). ``edge_weight``: the ``edata`` key of the edge weights; edge
        data under other keys, which scalegnn's GCN would not use, is refused by name
        (``g.edata.pop(key)`` to train without it).

        ``g.ndata[feature]`` are the features; ``label`` is the ``ndata`` key of the
        labels or the label tensor itself (OGB's DGL loaders return labels apart).
        The split is ``ndata``'s ``train_mask``/``val_mask``/``test_mask`` when it has
        all three (DGL's built-in datasets do), else a seeded random 50/25/25 split;
        ``meta["split"]`` says which. A heterogeneous graph is refused: convert it
        with ``dgl.to_homogeneous`` first."""
        from types import SimpleNamespace

        ntypes, etypes = getattr(g, "ntypes", ["_N"]), getattr(g, "canonical_etypes", [None])
        if len(ntypes) != 1 or len(etypes) != 1:
            raise GraphValidationError(f"the DGL graph has {len(ntypes)} node and {len(etypes)} edge types; scalegnn "
                                       "trains homogeneous graphs: convert it with dgl.to_homogeneous(g, ndata=[...])")
        for key in [feature] + ([label] if isinstance(label, str) else []):
            if key not in g.ndata:
                raise GraphValidationError(f"the DGL graph has no ndata[{key!r}] (it has {sorted(g.ndata.keys())}); "
                                           "name the features and labels with feature=... and label=...")
        y = g.ndata[label] if isinstance(label, str) else torch.as_tensor(label)
        edata = sorted(getattr(g, "edata", {}).keys())
        if edge_weight is not None and edge_weight not in edata:
            raise GraphValidationError(f"the DGL graph has no edata[{edge_weight!r}] (it has {edata}); name the edge "
                                       "weights with edge_weight=...")
        unused = [k for k in edata if k != edge_weight]
        if unused:
            raise GraphValidationError(f"the DGL graph has edata {unused}, which scalegnn's GCN would not use: name "
                                       "the edge weights with edge_weight='key', and drop the rest (g.edata.pop(key))")
        src, dst = g.edges()
        masks = {f"{s}_mask": g.ndata[f"{s}_mask"] for s in ("train", "val", "test")
                 if all(f"{m}_mask" in g.ndata for m in ("train", "val", "test"))}
        view = SimpleNamespace(edge_index=torch.stack([src, dst]), x=g.ndata[feature], y=y,
                               edge_weight=None if edge_weight is None else g.edata[edge_weight], **masks)
        graph = cls.from_pyg(view, name=name, seed=seed)
        split = graph.meta["split"].replace("masks of the PyG object", "masks in the DGL graph's ndata") \
            .replace("the PyG object has no masks", "the DGL graph has no masks")
        return graph.replace(meta={**graph.meta, "source": type(g).__name__, "split": split})

    # --------------------------------------------------------- operations
    def symmetrize(self) -> "Graph":
        """A + A^T pattern with unit weights: every edge in both directions, once."""
        rows = self.row_ids()
        src = torch.cat([rows, self.indices])
        dst = torch.cat([self.indices, rows])
        return self.with_edges(src, dst)

    def add_self_loops(self) -> "Graph":
        """A + I: a unit self loop on every vertex that has none (existing ones are kept)."""
        rows = self.row_ids()
        has_loop = torch.zeros(self.num_nodes, dtype=torch.bool)
        has_loop[rows[rows == self.indices]] = True
        missing = (~has_loop).nonzero().flatten()
        src = torch.cat([rows, missing])
        dst = torch.cat([self.indices, missing])
        vals = torch.cat([self.values, torch.ones(missing.numel())])
        indptr, indices, vals = csr_from_edges(src, dst, self.num_nodes, vals)
        added = int(self.meta.get("self_loops_added", 0)) + missing.numel()
        return self.replace(indptr=indptr, indices=indices, values=vals, meta={**self.meta, "self_loops_added": added})

    def gcn_normalize(self) -> "Graph":
        """The GCN adjacency D^-1/2 (A+I) D^-1/2 (Kipf & Welling, paper Eq. 3).

        Self loops are added where missing; D is the row sum of A+I. The result is
        symmetric whenever A is.
        """
        g = self.add_self_loops()
        deg = torch.zeros(g.num_nodes, dtype=torch.float64)
        rows = g.row_ids()
        deg.index_add_(0, rows, g.values.double())
        inv_sqrt = torch.where(deg > 0, deg.rsqrt(), torch.zeros_like(deg))
        vals = (inv_sqrt[rows] * g.values.double() * inv_sqrt[g.indices]).float()
        return g.replace(values=vals, meta={**g.meta, "normalized": "gcn"})

    def permute(self, perm) -> "Graph":
        """Relabel vertices: old vertex ``perm[i]`` becomes new vertex ``i``.

        Adjacency, features, labels and splits move together, so a model trained on
        the permuted graph sees exactly the same problem.
        """
        perm = _as_long(perm, "perm")
        n = self.num_nodes
        if perm.numel() != n or not torch.equal(torch.sort(perm).values, torch.arange(n)):
            raise GraphValidationError(f"perm must be a permutation of 0..{n - 1}")
        new_id = torch.empty(n, dtype=torch.int64)
        new_id[perm] = torch.arange(n)
        rows = self.row_ids()
        indptr, indices, vals = csr_from_edges(new_id[rows], new_id[self.indices], n, self.values)
        return self.replace(
            indptr=indptr,
            indices=indices,
            values=vals,
            x=select_rows(self.x, perm),
            y=self.y[perm],
            train_idx=torch.sort(new_id[self.train_idx]).values,
            val_idx=torch.sort(new_id[self.val_idx]).values,
            test_idx=torch.sort(new_id[self.test_idx]).values,
        )

    def subgraph(self, nodes) -> "Graph":
        """The subgraph induced by ``nodes`` (kept in the given order), with its data.

        Splits keep the vertices that survive; an empty split raises, since the
        result would not be trainable.
        """
        nodes = _as_long(nodes, "nodes")
        n = self.num_nodes
        local = torch.full((n,), -1, dtype=torch.int64)
        local[nodes] = torch.arange(nodes.numel())
        rows = self.row_ids()
        keep = (local[rows] >= 0) & (local[self.indices] >= 0)
        indptr, indices, vals = csr_from_edges(
            local[rows[keep]], local[self.indices[keep]], nodes.numel(), self.values[keep]
        )
        split = lambda idx: torch.sort(local[idx][local[idx] >= 0]).values  # noqa: E731
        return self.replace(
            indptr=indptr,
            indices=indices,
            values=vals,
            x=select_rows(self.x, nodes),
            y=self.y[nodes],
            train_idx=split(self.train_idx),
            val_idx=split(self.val_idx),
            test_idx=split(self.test_idx),
        )

    def degrees(self) -> torch.Tensor:
        return self.indptr[1:] - self.indptr[:-1]

    def stats(self) -> dict:
        deg = self.degrees().double()
        loops = int((self.row_ids() == self.indices).sum())
        return {
            "name": self.name,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "self_loops": loops,
            "avg_degree": float(deg.mean()),
            "max_degree": int(deg.max()) if self.num_nodes else 0,
            "num_features": self.num_features,
            "sparse_features": is_csr(self.x),
            "num_classes": self.num_classes,
            "multilabel": self.multilabel,
            "train": self.train_idx.numel(),
            "val": self.val_idx.numel(),
            "test": self.test_idx.numel(),
        }

    def state_symmetrized(self) -> None:
        """Say, as a warning on the ``scalegnn`` logger, that this graph was made undirected
        from an input that was not (``meta["symmetrized"]``); nothing otherwise."""
        if self.meta.get("symmetrized"):
            state_symmetrized(self.name, self.meta.get("input_edges"), self.num_edges, bool(self.meta.get("weighted")))

    # Where a graph's split and node data came from, as ``meta`` says: the loaders
    # write these keys, and a run record carries them (``record_info``).
    PROVENANCE = ("split", "features", "labels", "stand_in", "weighted", "symmetrized", "input_edges", "unread")

    def record_info(self) -> dict:
        """The run record's ``graph`` field: the sizes, whether the features are sparse
        (CSR end to end), and the provenance keys of ``meta`` that are set (the split
        used, a stand-in for features or labels the data did not have, edge weights used,
        a directed input made undirected with the input's edge count, and what of a
        user's file was not read).
        ``num_edges`` is the graph's as given (``scalegnn data info`` says the same),
        ``adjacency_nnz`` the entries of the matrix trained on: with the self loops that
        :meth:`add_self_loops` (the GCN normalization) added."""
        added = int(self.meta.get("self_loops_added", 0))
        return {"num_nodes": self.num_nodes, "num_edges": self.num_edges - added, "adjacency_nnz": self.num_edges,
                "num_features": self.num_features, "num_classes": self.num_classes, "sparse_features": is_csr(self.x),
                **{k: self.meta[k] for k in self.PROVENANCE if k in self.meta}}


def state_symmetrized(name: str, input_edges, entries: int, weighted: bool = False) -> None:
    """The one line that says a graph given with edges that were not symmetric is trained
    undirected (a warning on the ``scalegnn`` logger), wherever it was read."""
    logging.getLogger("scalegnn.graph").warning(
        "%s: the edges given are not symmetric (%s edges, some without their reverse%s); scalegnn trains the "
        "undirected graph, every edge both ways (%d entries)%s", name, input_edges,
        " or weighted otherwise the other way" if weighted else "", entries,
        ", each edge's weight the mean of the weights given for its two directions" if weighted else "")


def as_graph(graph, *, name: str | None = None, seed: int = 0) -> "Graph":
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


def random_split(n: int, fractions=(0.5, 0.25, 0.25), seed: int = 0, labeled=None):
    """A seeded random split of the labeled vertices into train/val/test index sets.

    ``fractions`` (train, val, test) of the labeled vertices; when they sum to 1 the
    test set is the rest (no vertex lost to rounding), below 1 the remainder is left
    out of every split."""
    g = np.random.default_rng(seed)
    pool = np.arange(n) if labeled is None else np.asarray(labeled)
    order = g.permutation(pool)
    n_train = int(round(fractions[0] * len(order)))
    n_val = int(round(fractions[1] * len(order)))
    whole = sum(fractions) >= 1 - 1e-9
    end = len(order) if whole else min(len(order), n_train + n_val + int(round(fractions[2] * len(order))))
    parts = order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val : end]
    return tuple(torch.from_numpy(np.sort(p)).long() for p in parts)
