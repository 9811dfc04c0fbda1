"""Small graphs the tests build, the raw-graph contract a loaded graph keeps, grids and
rank shards (a grid's name and 3D coordinates, a shard whose planes share no storage),
and the serial-vs-rank sample tiling several test files check."""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp
import torch

from scalegnn.graph import Graph
from scalegnn.parallel.dist_sampling import DistributedSampler
from scalegnn.parallel.grid import ProcessGrid
from scalegnn.parallel.layout import PLANES
from scalegnn.parallel.sharding import RankShard, build_rank_shard, grid_coords  # noqa: F401 - for the tests
from scalegnn.sampling import CSRBlock, UniformVertexSampler


def parallel_graph(n=37, m=150, f=7, c=5, seed=0, multilabel=False, train=None, sparse=False,
                   symmetric=True) -> Graph:
    """A small random normalized graph with awkward sizes (37 vertices, 7 features,
    5 classes: divisible by none of the axis sizes), some unlabeled test vertices.
    ``sparse``: 3 % dense multi-hot features, which the samplers keep as CSR.
    ``symmetric=False``: the drawn edges one way only (A != A^T)."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (m,), generator=gen), torch.randint(0, n, (m,), generator=gen)
    if multilabel:
        y = (torch.rand(n, c, generator=gen) < 0.3).float()
    else:
        y = torch.randint(0, c, (n,), generator=gen)
        y[n - 3:] = -1  # unlabeled (test split only)
    train_idx = torch.arange(0, n // 2) if train is None else torch.as_tensor(train)
    x = (torch.rand(n, f, generator=gen) < 0.03).float() if sparse else torch.randn(n, f, generator=gen)
    base = Graph(torch.zeros(n + 1, dtype=torch.long), [], [], x, y,
                 train_idx, torch.arange(n // 2, 3 * n // 4), torch.arange(3 * n // 4, n), c)
    base = base.with_edges(src, dst)
    return (base.symmetrize() if symmetric else base).gcn_normalize()


def nprocs(shape) -> int:
    return shape[0] * shape[1] * shape[2] * shape[3]


def grid_id(shape) -> str:
    """A grid's name in test ids: ``1x2x2x1``."""
    return "x".join(map(str, shape))


def _unshared(blocks) -> tuple:
    """Every plane its own copy of its arrays (what a rank held before sharing)."""
    return tuple(CSRBlock(b.indptr.clone(), b.indices.clone(), b.values.clone(), b.row_start, b.row_end, b.col_start,
                          b.col_end) for b in blocks)


def unshared_shard(shard: RankShard) -> RankShard:
    """``shard`` with every rotation plane a separate copy (no storage shared between planes)."""
    alt = shard.alt
    if alt is not None:
        alt = dataclasses.replace(alt, adj=_unshared(alt.adj), adj_t=_unshared(alt.adj_t))
    return dataclasses.replace(shard, adj=alt.adj if alt is not None else _unshared(shard.adj), alt=alt)


def random_graph(n=200, m=1200, seed=0, features=8) -> Graph:
    """A random normalized graph of ``n`` vertices, 3 classes, half of them training vertices."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (m,), generator=gen), torch.randint(0, n, (m,), generator=gen)
    base = Graph(torch.zeros(n + 1, dtype=torch.long), [], [], torch.randn(n, features, generator=gen),
                 torch.randint(0, 3, (n,), generator=gen), torch.arange(0, n // 2), torch.arange(n // 2, 3 * n // 4),
                 torch.arange(3 * n // 4, n), 3)
    return base.with_edges(src, dst).symmetrize().gcn_normalize()


def tile_rank_samples(graph, shape, batch, seed, step, dp):
    """Sample on every rank of data-parallel group ``dp`` of a virtual grid of ``shape``
    and place each rank's plane blocks at their offsets in three (B, B) planes.
    Checked on the way: every rank draws the serial sample, each block sits at the row
    partition's offsets, replicas of a block agree (the first one fills, NaN marks
    never-filled). Returns (the serial batch, the planes, [(shard, rank batch)])."""
    ref = UniformVertexSampler(graph, batch, seed=seed, dp_index=dp).sample(step)
    b = ref.nodes.numel()
    planes = [torch.full((b, b), float("nan")) for _ in range(3)]
    ranks = []
    for rank in range(shape[0] * shape[1] * shape[2] * shape[3]):
        grid = ProcessGrid.virtual(*shape, rank)
        if grid.axis_index("dp") != dp:
            continue
        shard = build_rank_shard(graph, grid)
        sb = DistributedSampler(shard, grid, batch, seed=seed).sample(step)
        assert torch.equal(sb.nodes, ref.nodes)  # same (seed, step, dp) -> same sample on every rank
        for p, blk in enumerate(sb.adj):
            r, c = PLANES[p]
            assert (blk.row_offset, blk.col_offset) == (sb.rows.block(r)[0], sb.rows.block(c)[0])
            rr, cc = blk.shape
            region = planes[p][blk.row_offset: blk.row_offset + rr, blk.col_offset: blk.col_offset + cc]
            block = blk.adj.to_dense()
            assert torch.isnan(region).all() or torch.equal(region, block)  # replicas agree
            region.copy_(block)
        ranks.append((shard, sb))
    return ref, planes, ranks


def assert_raw(g):
    """The raw-graph contract: symmetric, unit weights, no self loops, sorted unique rows."""
    rows = g.row_ids()
    assert not bool((rows == g.indices).any()), "self loop stored"
    assert bool((g.values == 1).all()), "weights must be 1"
    key = rows * g.num_nodes + g.indices
    assert bool((key[1:] > key[:-1]).all()), "entries not sorted and unique"
    a = g.to_scipy()
    assert (a != a.T).nnz == 0, "adjacency not symmetric"


def split_sizes(g):
    return g.train_idx.numel(), g.val_idx.numel(), g.test_idx.numel()


def stored_entries(pairs, n):
    """Reference count of stored entries for an edge list: both directions, no loops, unique."""
    m = sp.coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n)).tocsr()
    m = ((m + m.T) > 0).astype(np.int8).tolil()
    m.setdiag(0)
    return m.tocsr().count_nonzero()


def assert_csr_invariants(g: Graph) -> None:
    """A valid CSR: indptr from 0 to nnz, non-decreasing; every row's ids strictly
    increasing (sorted, no duplicates) and inside [0, N)."""
    n = g.num_nodes
    assert g.indptr[0] == 0 and g.indptr[-1] == g.indices.numel()
    assert bool((g.indptr[1:] >= g.indptr[:-1]).all())
    for r in range(n):
        row = g.indices[g.indptr[r]: g.indptr[r + 1]]
        assert bool((row[1:] > row[:-1]).all()), f"row {r} not strictly increasing: {row}"
        assert bool(((row >= 0) & (row < n)).all())


def same_shard(got, want) -> None:
    """Two RankShards equal tensor for tensor (dtypes too), and holding the same bytes."""
    for p, (a, b) in enumerate(zip(got.adj, want.adj)):
        assert (a.row_start, a.row_end, a.col_start, a.col_end) == (b.row_start, b.row_end, b.col_start, b.col_end), p
        for t in ("indptr", "indices", "values"):
            ta, tb = getattr(a, t), getattr(b, t)
            assert ta.dtype == tb.dtype and torch.equal(ta, tb), (p, t)
    assert got.x.dtype == want.x.dtype and torch.equal(got.x, want.x)
    for key in ("y", "train_mask", "val_mask", "test_mask"):
        assert getattr(got, key).keys() == getattr(want, key).keys()
        for ax, t in getattr(got, key).items():
            assert t.dtype == getattr(want, key)[ax].dtype and torch.equal(t, getattr(want, key)[ax]), (key, ax)
    for f in ("grid_shape", "coords", "num_nodes", "num_features", "num_classes", "multilabel", "feature_range",
              "vertex_ranges", "name"):
        assert getattr(got, f) == getattr(want, f), f
    assert got.nbytes() == want.nbytes()
