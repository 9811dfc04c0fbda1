"""Where every block lives: the 3D layout table and block ranges.

Shape legend:
    N  vertices of the graph        B  rows of the batch (sampled vertices; N for full graph)
    F  input features               H  hidden dim d_h           C  classes

A matrix is *laid out on (a, b)* when its rows are split along grid axis ``a`` and
its columns along grid axis ``b``; it is then replicated along the third axis.

Row splits. Row blocks follow the global VERTEX ranges of the axis: block i of axis
``a`` holds the batch rows whose global vertex id lies in
``split_range(N, G_a, i)``. With a sorted batch those rows are a contiguous run of
batch positions, found by binary search (:class:`RowPartition`); sizes are uneven
but every rank computes all of them locally, with no communication.

Column splits. Feature, hidden and class columns are split with
:func:`~scalegnn.parallel.grid.split_range` over the axis (:func:`col_bounds`).

Layer rotation (paper IV-C3, period 3). A layer whose input features are on
``(r, c)`` (third axis ``t``) computes::

    H   = AllReduce_r( A[t, r] @ X[r, c] )        H on (t, c)       SpMM, Eq. 27
    Z   = AllReduce_c( H[t, c] @ W[c, r] )        Z on (t, r)       GEMM, Eq. 28

so its output is on ``(t, r)``, the next layer's input. Starting from ``(x, y)``:

    | l mod 3 | in     | A      | SpMM AR | H      | W      | GEMM AR | out    |
    |---------|--------|--------|---------|--------|--------|---------|--------|
    | 0       | (x, y) | (z, x) | x       | (z, y) | (y, x) | y       | (z, x) |
    | 1       | (z, x) | (y, z) | z       | (y, x) | (x, z) | x       | (y, z) |
    | 2       | (y, z) | (x, y) | y       | (x, z) | (z, y) | z       | (x, y) |

The input projection is ``AllReduce_z( X_in[x, z] @ W_in[z, y] )`` on ``(x, y)``;
the output head, for final features on ``(a, b)`` (third axis ``d``), is
``AllReduce_b( X[a, b] @ W_out[b, d] )``: logits on ``(a, d)``, class-sharded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..ranges import split_bounds
from .grid import PMM_AXES, ProcessGrid, third_axis

__all__ = ["LayerLayout", "layer_layout", "INPUT_LAYOUT", "final_layout", "HeadLayout", "head_layout",
           "adjacency_plane", "PLANES", "RowPartition", "col_bounds", "interval_overlap"]

INPUT_LAYOUT = ("x", "y")

# Adjacency shard (rows axis, cols axis) per plane p = layer mod 3 (the "A" column above).
PLANES = (("z", "x"), ("y", "z"), ("x", "y"))


@dataclass(frozen=True)
class LayerLayout:
    """The row of the rotation table for one layer (see the module docstring)."""

    feat: tuple[str, str]  # (r, c): layer input X
    adj: tuple[str, str]  # (t, r): adjacency shard
    spmm_axis: str  # r
    h: tuple[str, str]  # (t, c)
    w: tuple[str, str]  # (c, r)
    gemm_axis: str  # c
    out: tuple[str, str]  # (t, r)


def layer_layout(layer: int) -> LayerLayout:
    """The layout of layer ``layer`` (0-based), derived from the input (x, y) by rotation."""
    r, c = INPUT_LAYOUT
    for _ in range(layer % 3):
        r, c = third_axis(r, c), r
    t = third_axis(r, c)
    lay = LayerLayout(feat=(r, c), adj=(t, r), spmm_axis=r, h=(t, c), w=(c, r), gemm_axis=c, out=(t, r))
    assert lay.adj == PLANES[layer % 3]
    return lay


def final_layout(num_layers: int) -> tuple[str, str]:
    """Layout of X_hL, the last layer's output (the input layout when L = 0)."""
    return layer_layout(num_layers - 1).out if num_layers > 0 else INPUT_LAYOUT


def adjacency_plane(layer: int) -> int:
    return layer % 3


@dataclass(frozen=True)
class HeadLayout:
    """Output head for final features on (a, b): W_out on (b, d), logits on (a, d)."""

    feat: tuple[str, str]  # (a, b)
    w: tuple[str, str]  # (b, d)
    reduce_axis: str  # b
    out: tuple[str, str]  # (a, d)

    @property
    def row_axis(self) -> str:
        return self.out[0]

    @property
    def class_axis(self) -> str:
        return self.out[1]


def head_layout(num_layers: int) -> HeadLayout:
    a, b = final_layout(num_layers)
    d = third_axis(a, b)
    return HeadLayout(feat=(a, b), w=(b, d), reduce_axis=b, out=(a, d))


def col_bounds(dim: int, grid: ProcessGrid, axis: str) -> list[int]:
    """Column boundaries of a ``dim``-wide matrix split along ``axis``."""
    return split_bounds(dim, grid.axis_size(axis))


def interval_overlap(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, max(lo, hi))


class RowPartition:
    """Row blocks of a batch along every 3D axis.

    ``nodes`` (B,) are the sorted global vertex ids of the batch rows. For axis
    ``ax`` the boundaries ``bounds[ax]`` (G_ax + 1 batch positions) come from a
    binary search of the vertex boundaries ``split_range(N, G_ax, i)`` in ``nodes``
    (Algorithm 2, phase 1): block i is batch rows ``[bounds[ax][i], bounds[ax][i+1])``.

    The bounds are host integers (block sizes are tensor shapes). ``host_nodes``, a
    CPU copy of ``nodes``, lets a sampler find them in host memory, so a batch on a
    GPU costs no device-to-host read; :meth:`full` needs no search at all.
    """

    def __init__(self, nodes: torch.Tensor, num_nodes: int, grid: ProcessGrid,
                 host_nodes: torch.Tensor | None = None, bounds: dict[str, list[int]] | None = None):
        self.nodes = nodes
        self.num_nodes = num_nodes
        self.grid = grid
        if bounds is None:
            search = nodes if host_nodes is None else host_nodes
            bounds = {}
            for ax in PMM_AXES:
                vb = split_bounds(num_nodes, grid.axis_size(ax))
                if search.device.type == "cpu":  # host memory: numpy's search, nothing to wait for
                    bounds[ax] = np.searchsorted(search.numpy(), vb).tolist()
                else:
                    vb = torch.tensor(vb, dtype=torch.int64, device=search.device)
                    bounds[ax] = torch.searchsorted(search, vb).tolist()
        self.bounds: dict[str, list[int]] = bounds

    @classmethod
    def full(cls, nodes: torch.Tensor, grid: ProcessGrid) -> "RowPartition":
        """The partition of the whole graph (``nodes`` = 0..N-1): block i of an axis is
        its vertex range, so the bounds are the vertex boundaries themselves."""
        n = nodes.numel()
        return cls(nodes, n, grid, bounds={ax: split_bounds(n, grid.axis_size(ax)) for ax in PMM_AXES})

    @property
    def size(self) -> int:
        return self.nodes.numel()

    def block(self, ax: str, index: int | None = None) -> tuple[int, int]:
        """Batch-row range of block ``index`` (default: this rank's) along ``ax``."""
        i = self.grid.axis_index(ax) if index is None else index
        return self.bounds[ax][i], self.bounds[ax][i + 1]

    def sizes(self, ax: str) -> list[int]:
        b = self.bounds[ax]
        return [b[i + 1] - b[i] for i in range(len(b) - 1)]

    def global_ids(self, ax: str) -> torch.Tensor:
        """Global vertex ids of this rank's row block along ``ax``."""
        lo, hi = self.block(ax)
        return self.nodes[lo:hi]
