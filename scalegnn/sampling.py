"""Uniform vertex sampling with unbiased edge rescaling (paper III-D, Algorithm 2).

Shape legend:
    N  vertices of the full graph      B  sampled vertices per step
    Br sampled vertices in a block's row range, Bc in its column range

One extraction routine, :func:`extract_block`, serves both the serial sampler (one
block covering the whole matrix) and every rank of the 3D grid (a block per
adjacency shard). It calls no collective: the sample is a pure function of
``(seed, dp_index, step)``, so every rank derives it independently (Algorithm 2,
line 1), and the rescaling factor ``p = (B-1)/(N-1)`` (Eq. 23) depends only on the
global constants B and N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .graph import Graph

__all__ = [
    "resolve_batch_size",
    "steps_per_epoch",
    "sample_vertices",
    "inclusion_probability",
    "CSRBlock",
    "SampledBlock",
    "CompactIndexMap",
    "extract_block",
    "SampledBatch",
    "UniformVertexSampler",
]


def resolve_batch_size(num_nodes: int, batch_size: int | None = None, batch_ratio: float | None = None) -> int:
    """B from either a count or a ratio of N; 2 <= B <= N (B = 1 makes p undefined)."""
    if (batch_size is None) == (batch_ratio is None):
        raise ValueError("give exactly one of batch_size (a vertex count) or batch_ratio (a fraction of N)")
    if batch_ratio is not None:
        if not 0.0 < batch_ratio <= 1.0:
            raise ValueError(f"batch_ratio must be in (0, 1], got {batch_ratio}")
        batch_size = max(2, int(round(batch_ratio * num_nodes)))
    if not 2 <= batch_size <= num_nodes:
        raise ValueError(
            f"batch size must be between 2 and N={num_nodes}, got {batch_size}; "
            "use --batch-ratio 1.0 for full-graph training"
        )
    return int(batch_size)


def steps_per_epoch(num_nodes: int, batch_size: int, dp_size: int = 1) -> int:
    """ceil(N / B) steps cover N vertices in expectation; Gd groups share them (paper IV-A)."""
    return max(1, math.ceil(math.ceil(num_nodes / batch_size) / dp_size))


def inclusion_probability(num_nodes: int, batch_size: int) -> float:
    """p = Pr[u in S | v in S] = (B-1)/(N-1) for u != v (Eq. 23); 1 for full-graph."""
    return 1.0 if num_nodes <= 1 else (batch_size - 1) / (num_nodes - 1)


def _step_seed(seed: int, dp_index: int, step: int) -> int:
    # SeedSequence mixes the three integers into well-separated streams, so
    # consecutive steps and neighbouring data-parallel groups are uncorrelated.
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, dp_index, step]).generate_state(1, np.uint64)[0] >> 1)


def sample_vertices(num_nodes: int, batch_size: int, seed: int, step: int, dp_index: int = 0) -> torch.Tensor:
    """The sorted sample S (B,), uniform without replacement (Eq. 20, Alg. 2 line 1).

    A pure function of its arguments: every rank of a data-parallel group calls it
    with the same (seed, dp_index, step) and gets the same S without communicating.
    B == N returns all vertices (full-graph training).
    """
    if batch_size >= num_nodes:
        return torch.arange(num_nodes, dtype=torch.int64)
    gen = torch.Generator().manual_seed(_step_seed(seed, dp_index, step))
    return torch.sort(torch.randperm(num_nodes, generator=gen)[:batch_size]).values


@dataclass(frozen=True)
class CSRBlock:
    """A block of the normalized adjacency: rows [row_start, row_end), columns
    [col_start, col_end), stored as CSR with local row ids and GLOBAL column ids
    (sorted within each row). The serial sampler uses one block spanning N x N."""

    indptr: torch.Tensor
    indices: torch.Tensor
    values: torch.Tensor
    row_start: int
    row_end: int
    col_start: int
    col_end: int

    @classmethod
    def from_graph(cls, graph: Graph, row_range=None, col_range=None) -> "CSRBlock":
        n = graph.num_nodes
        r0, r1 = row_range or (0, n)
        c0, c1 = col_range or (0, n)
        lo, hi = int(graph.indptr[r0]), int(graph.indptr[r1])
        indptr = graph.indptr[r0 : r1 + 1] - lo
        indices, values = graph.indices[lo:hi], graph.values[lo:hi]
        if (c0, c1) != (0, n):
            keep = (indices >= c0) & (indices < c1)
            counts = torch.zeros(r1 - r0, dtype=torch.int64)
            rows = torch.repeat_interleave(torch.arange(r1 - r0), indptr[1:] - indptr[:-1])
            counts.index_add_(0, rows[keep], torch.ones_like(rows[keep]))
            indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
            indices, values = indices[keep], values[keep]
        return cls(indptr.contiguous(), indices.contiguous(), values.contiguous(), r0, r1, c0, c1)

    @property
    def nnz(self) -> int:
        return self.indices.numel()


@dataclass
class SampledBlock:
    """The local block of the rescaled sampled adjacency A~_S (Alg. 2 output).

    ``adj`` is (Br, Bc) CSR in compact local ids; ``adj_t`` is its transpose (Bc, Br),
    built in the same pass for the backward SpMM (Eq. 17). ``row_offset`` and
    ``col_offset`` locate the block inside the (B, B) sampled matrix.
    """

    adj: torch.Tensor
    adj_t: torch.Tensor
    row_offset: int
    col_offset: int

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.adj.shape)


class CompactIndexMap:
    """Persistent global-id -> compact-id map tagged with the step (Alg. 2 line 14).

    Writing the B sampled ids with the current tag makes every stale entry
    invisible, so no N-sized array is cleared per step: the update is O(B).
    """

    def __init__(self, num_nodes: int):
        self.compact = torch.zeros(num_nodes, dtype=torch.int64)
        self.tag = torch.full((num_nodes,), -1, dtype=torch.int64)
        self._next_tag = 0

    def assign(self, ids: torch.Tensor) -> int:
        """Map ``ids[k] -> k`` under a fresh tag; returns the tag."""
        tag = self._next_tag
        self._next_tag += 1
        self.compact[ids] = torch.arange(ids.numel(), dtype=torch.int64)
        self.tag[ids] = tag
        return tag

    def lookup(self, ids: torch.Tensor, tag: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(member mask, compact ids) for global ``ids`` under ``tag``."""
        return self.tag[ids] == tag, self.compact[ids]


def _csr(indptr, indices, values, shape) -> torch.Tensor:
    return torch.sparse_csr_tensor(indptr, indices, values, shape, check_invariants=False)


def _build_csr_pair(rows, cols, vals, n_rows, n_cols):
    """Forward CSR and transposed CSR from row-sorted (rows, cols, vals) triples.

    Rows are already sorted (the gather walks sampled rows in order), so the forward
    indptr is a bincount; the transpose is a stable sort by column, which keeps the
    rows sorted inside each column.
    """
    fwd_ptr = torch.zeros(n_rows + 1, dtype=torch.int64)
    fwd_ptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n_rows), 0)
    order = torch.sort(cols, stable=True).indices
    t_ptr = torch.zeros(n_cols + 1, dtype=torch.int64)
    t_ptr[1:] = torch.cumsum(torch.bincount(cols, minlength=n_cols), 0)
    adj = _csr(fwd_ptr, cols, vals, (n_rows, n_cols))
    adj_t = _csr(t_ptr, rows[order], vals[order], (n_cols, n_rows))
    return adj, adj_t


def gather_csr_rows(indptr: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of the stored entries of ``rows`` in CSR order (Alg. 2 lines 7-10).

    Returns (owner, flat): ``flat[k]`` indexes indices/values, ``owner[k]`` is the
    position in ``rows`` of the row it belongs to. One prefix sum and one sorted
    search; no Python loop over rows.
    """
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    prefix = torch.cumsum(counts, 0)
    total = int(prefix[-1]) if rows.numel() else 0
    k = torch.arange(total, dtype=torch.int64)
    owner = torch.searchsorted(prefix, k, right=True)
    return owner, starts[owner] + (k - (prefix[owner] - counts[owner]))


# Input features sparser than this are kept as CSR: multi-hot bag-of-words features
# (Facebook 0.3 %, Planetoid ~1 %) make the input projection 10-20x cheaper that way.
SPARSE_FEATURE_DENSITY = 0.05


def training_features(x: torch.Tensor) -> torch.Tensor:
    """``x`` as CSR when it is sparse enough to profit, else unchanged (dense)."""
    if x.layout == torch.strided and x.numel() and (x != 0).sum().item() < SPARSE_FEATURE_DENSITY * x.numel():
        return x.to_sparse_csr()
    return x


def select_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x[rows]`` for a dense or a CSR matrix (CSR has no index_select in torch)."""
    if x.layout == torch.strided:
        return x[rows]
    indptr = x.crow_indices()
    owner, flat = gather_csr_rows(indptr, rows)
    new_ptr = torch.zeros(rows.numel() + 1, dtype=torch.int64)
    new_ptr[1:] = torch.cumsum(indptr[rows + 1] - indptr[rows], 0)
    return torch.sparse_csr_tensor(new_ptr, x.col_indices()[flat], x.values()[flat], (rows.numel(), x.shape[1]),
                                   check_invariants=False)


def extract_block(
    block: CSRBlock,
    sample: torch.Tensor,
    scale: float,
    index_map: CompactIndexMap | None = None,
) -> SampledBlock:
    """Algorithm 2, phases 1-4, for one adjacency block. Calls no collective.

    Args:
        block: the local CSR block (rows local, columns global).
        sample: the sorted global sample S (B,).
        scale: p of Eq. 23; off-diagonal weights are divided by it (Eq. 24).
        index_map: a persistent tagged map for the column remap; without one a
            binary search over S_c does the membership test and remap.
    """
    # Phase 1: the parts of S inside this block's row and column ranges (binary search).
    r_lo, r_hi = torch.searchsorted(sample, torch.tensor([block.row_start, block.row_end])).tolist()
    c_lo, c_hi = torch.searchsorted(sample, torch.tensor([block.col_start, block.col_end])).tolist()
    s_rows, s_cols = sample[r_lo:r_hi], sample[c_lo:c_hi]
    n_rows, n_cols = s_rows.numel(), s_cols.numel()

    # Phase 2: gather the sampled rows with a prefix sum and a sorted search (lines 7-10).
    owner, flat = gather_csr_rows(block.indptr, s_rows - block.row_start)
    cols_g = block.indices[flat]
    vals = block.values[flat]

    # Phase 3: keep columns in S_c and remap them to compact ids (lines 12-14).
    if index_map is not None:
        tag = index_map.assign(s_cols)
        keep, cols_c = index_map.lookup(cols_g, tag)
    else:
        pos = torch.searchsorted(s_cols, cols_g).clamp_(max=max(n_cols - 1, 0))
        keep = s_cols[pos] == cols_g if n_cols else torch.zeros_like(cols_g, dtype=torch.bool)
        cols_c = pos
    rows_c, cols_c, cols_g, vals = owner[keep], cols_c[keep], cols_g[keep], vals[keep]

    # Phase 4: rescale off-diagonal weights by 1/p (Eq. 24) and assemble both CSRs.
    if scale != 1.0:
        off_diag = s_rows[rows_c] != cols_g
        vals = torch.where(off_diag, vals / scale, vals)
    adj, adj_t = _build_csr_pair(rows_c, cols_c, vals, n_rows, n_cols)
    return SampledBlock(adj=adj, adj_t=adj_t, row_offset=r_lo, col_offset=c_lo)


@dataclass
class SampledBatch:
    """One serial mini-batch (Algorithm 1, lines 1-4).

    nodes (B,) sorted global ids; adj / adj_t (B, B) CSR of A~_S and its transpose;
    x (B, F), dense or CSR (see :func:`training_features`); y (B,) or (B, C); train_mask (B,) marks sampled vertices whose loss
    counts (training vertices that carry a label); step and scale p are kept for
    the record and for tests.
    """

    step: int
    nodes: torch.Tensor
    adj: torch.Tensor
    adj_t: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor
    scale: float

    @property
    def batch_size(self) -> int:
        return self.nodes.numel()


def train_mask_of(graph: Graph) -> torch.Tensor:
    mask = torch.zeros(graph.num_nodes, dtype=torch.bool)
    mask[graph.train_idx] = True
    if not graph.multilabel:
        mask &= graph.y >= 0
    return mask


class UniformVertexSampler:
    """Serial uniform vertex sampler over a GCN-normalized graph.

    ``sample(step)`` is deterministic in (seed, dp_index, step), so a resumed or a
    distributed run sees exactly the batches of an uninterrupted serial one.
    """

    def __init__(self, graph: Graph, batch_size: int, seed: int = 0, dp_index: int = 0):
        if graph.meta.get("normalized") != "gcn":
            raise ValueError("UniformVertexSampler needs the GCN-normalized graph: call graph.gcn_normalize() first")
        self.graph = graph
        self.batch_size = resolve_batch_size(graph.num_nodes, batch_size=batch_size)
        self.seed, self.dp_index = seed, dp_index
        self.scale = inclusion_probability(graph.num_nodes, self.batch_size)
        self.block = CSRBlock.from_graph(graph)
        self.index_map = CompactIndexMap(graph.num_nodes)
        self.train_mask = train_mask_of(graph)
        self.features = training_features(graph.x)

    def __len__(self) -> int:
        return steps_per_epoch(self.graph.num_nodes, self.batch_size)

    def sample(self, step: int) -> SampledBatch:
        nodes = sample_vertices(self.graph.num_nodes, self.batch_size, self.seed, step, self.dp_index)
        blk = extract_block(self.block, nodes, self.scale, self.index_map)
        return SampledBatch(
            step=step,
            nodes=nodes,
            adj=blk.adj,
            adj_t=blk.adj_t,
            x=select_rows(self.features, nodes),
            y=self.graph.y[nodes],
            train_mask=self.train_mask[nodes],
            scale=self.scale,
        )
