"""Uniform vertex sampler (scalegnn/sampling.py): invariants, the statistical
unbiasedness of Eq. 25, and a property over hostile random graphs (hypothesis): a
sorted unique sample of B vertices whose sampled matrix is the induced subgraph of the
normalized A with off-diagonal entries divided by p = (B-1)/(N-1) (Eq. 24)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from scalegnn.sampling import (CSRBlock, UniformVertexSampler, extract_block, inclusion_probability,
                               resolve_batch_size, sample_vertices, steps_per_epoch)
from tests.graphs import random_graph
from tests.strategies import SETTINGS, edge_lists, graph_of


def test_batch_size_resolution_and_steps():
    assert resolve_batch_size(1000, batch_ratio=0.1) == 100
    assert resolve_batch_size(1000, batch_size=7) == 7
    assert steps_per_epoch(1000, 300) == 4 and steps_per_epoch(1000, 300, dp_size=2) == 2
    for bad in (dict(batch_size=1), dict(batch_size=1001), dict(batch_ratio=0.0), dict()):
        with pytest.raises(ValueError):
            resolve_batch_size(1000, **bad)


def test_sample_is_sorted_unique_and_a_pure_function_of_seed_step_dp():
    s = sample_vertices(1000, 100, seed=3, step=7)
    assert s.numel() == 100 and torch.equal(s, torch.unique(s))  # unique() sorts
    assert torch.equal(s, sample_vertices(1000, 100, seed=3, step=7))
    assert not torch.equal(s, sample_vertices(1000, 100, seed=3, step=8))
    assert not torch.equal(s, sample_vertices(1000, 100, seed=4, step=7))
    assert not torch.equal(s, sample_vertices(1000, 100, seed=3, step=7, dp_index=1))
    assert torch.equal(sample_vertices(50, 50, 0, 0), torch.arange(50))


@pytest.mark.parametrize("step", [0, 1, 5])
def test_sampled_matrix_is_the_rescaled_induced_subgraph(step):
    g = random_graph()
    sampler = UniformVertexSampler(g, batch_size=40, seed=11)
    b = sampler.sample(step)
    a = g.to_torch_csr().to_dense()
    p = (40 - 1) / (g.num_nodes - 1)
    assert b.scale == pytest.approx(p)
    ref = a[b.nodes][:, b.nodes]
    off = ~torch.eye(40, dtype=torch.bool)
    ref[off] = ref[off] / p  # Eq. 24: off-diagonal / p, self loops untouched
    got = b.adj.to_dense()
    assert torch.allclose(got, ref, rtol=1e-6, atol=0)
    assert torch.equal(got.diagonal(), a[b.nodes, b.nodes])  # self loops exactly unchanged
    assert torch.equal(b.adj_t.to_dense(), got.T)
    # only induced edges: the stored entries are exactly the nonzeros of A[S, S]
    assert b.adj._nnz() == int((a[b.nodes][:, b.nodes] != 0).sum())
    assert torch.equal(b.x, g.x[b.nodes]) and torch.equal(b.y, g.y[b.nodes])
    train = torch.zeros(g.num_nodes, dtype=torch.bool)
    train[g.train_idx] = True
    assert torch.equal(b.train_mask, train[b.nodes])


def test_block_extraction_with_and_without_tagged_map_agree_and_tile_the_matrix():
    g = random_graph(n=150, m=900)
    sample = sample_vertices(150, 60, seed=2, step=4)
    p = inclusion_probability(150, 60)
    full = extract_block(CSRBlock.from_graph(g), sample, p).adj.to_dense()
    tiled = torch.zeros_like(full)
    for rows in ((0, 47), (47, 150)):
        for cols in ((0, 90), (90, 101), (101, 150)):
            block = CSRBlock.from_graph(g, rows, cols)
            a = extract_block(block, sample, p)
            b = extract_block(block, sample, p, index_map=None)
            assert torch.equal(a.adj.to_dense(), b.adj.to_dense())
            r, c = a.row_offset, a.col_offset
            h, w = a.shape
            tiled[r : r + h, c : c + w] += a.adj.to_dense()
            assert torch.equal(a.adj_t.to_dense(), a.adj.to_dense().T)
    assert torch.equal(tiled, full)


def test_full_batch_is_the_unscaled_full_matrix():
    g = random_graph(n=80, m=300)
    b = UniformVertexSampler(g, batch_size=80).sample(0)
    assert b.scale == 1.0
    assert torch.equal(b.adj.to_dense(), g.to_torch_csr().to_dense())


def test_rescaled_aggregation_is_unbiased():
    """Eq. 25: E[(A~_S X_S)_v | v in S] = (A X)_v.

    For each vertex v we average the sampled aggregation over the samples that
    contain it, and compare with the full-graph value. The bound is z standard
    errors of that mean, estimated from the sample variance; z = 5 keeps the
    family-wise false alarm rate over all N*d comparisons below 1e-3 (normal
    tails: 2 * 2.9e-7 per comparison * 480 comparisons = 2.8e-4). The same
    bound must reject the un-rescaled estimator, which shows the test has power.
    """
    g = random_graph(n=60, m=400, features=8, seed=5)
    n, batch, trials = 60, 15, 6000
    x = g.x.double()
    truth = g.to_torch_csr().to_dense().double() @ x
    sampler = UniformVertexSampler(g, batch_size=batch, seed=9)
    total, total_sq, plain = torch.zeros(n, 8, dtype=torch.float64), torch.zeros(n, 8, dtype=torch.float64), \
        torch.zeros(n, 8, dtype=torch.float64)
    count = torch.zeros(n, dtype=torch.float64)
    p = inclusion_probability(n, batch)
    for step in range(trials):
        b = sampler.sample(step)
        adj = b.adj.to_dense().double()
        agg = adj @ x[b.nodes]
        total[b.nodes] += agg
        total_sq[b.nodes] += agg**2
        off = adj - torch.diag(adj.diagonal())
        plain[b.nodes] += (off * p + torch.diag(adj.diagonal())) @ x[b.nodes]  # without Eq. 24
        count[b.nodes] += 1
    assert bool((count > 0.7 * trials * batch / n).all())
    mean = total / count[:, None]
    var = total_sq / count[:, None] - mean**2
    stderr = (var / count[:, None]).sqrt().clamp_min(1e-12)
    z = 5.0
    assert bool(((mean - truth).abs() <= z * stderr + 1e-12).all()), float(((mean - truth).abs() / stderr).max())
    biased = plain / count[:, None]
    assert float(((biased - truth).abs() / stderr).max()) > z


def test_sampler_requires_normalized_graph():
    g = random_graph()
    raw = g.replace(meta={})
    with pytest.raises(ValueError, match="gcn_normalize"):
        UniformVertexSampler(raw, batch_size=10)
    assert math.isclose(inclusion_probability(10, 10), 1.0)


def test_sparse_features_are_gathered_as_csr_and_equal_dense_rows():
    g = random_graph(n=120, m=500)
    x = (torch.rand(120, 90, generator=torch.Generator().manual_seed(1)) < 0.02).float()
    g = g.replace(x=x)
    b = UniformVertexSampler(g, batch_size=30, seed=2).sample(1)
    assert b.x.layout == torch.sparse_csr
    assert torch.equal(b.x.to_dense(), x[b.nodes])
    dense = UniformVertexSampler(random_graph(n=120, m=500), batch_size=30, seed=2).sample(1)
    assert dense.x.layout == torch.strided


# ----------------------------------------------------------------------------- properties (hypothesis)
def _dense(csr) -> torch.Tensor:
    return csr.to_dense()


@SETTINGS
@given(edge_lists(min_nodes=2, max_nodes=20, max_edges=60), st.data())
def test_sample_is_the_rescaled_induced_subgraph(data, draw):
    n, edges = data
    g = graph_of(n, edges).gcn_normalize()
    b = draw.draw(st.integers(2, n), label="B")
    seed, step = draw.draw(st.integers(0, 2**31 - 1), label="seed"), draw.draw(st.integers(0, 10**6), label="step")
    batch = UniformVertexSampler(g, b, seed=seed).sample(step)
    nodes = batch.nodes
    assert nodes.numel() == b and torch.equal(nodes, torch.unique(nodes))  # sorted, unique
    assert int(nodes.min()) >= 0 and int(nodes.max()) < n
    a = g.to_torch_csr().to_dense().double()
    ref = a[nodes][:, nodes]
    off = ~torch.eye(b, dtype=torch.bool)
    ref[off] = ref[off] / inclusion_probability(n, b)
    got = _dense(batch.adj).double()
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=1e-7)
    assert torch.equal(_dense(batch.adj_t), _dense(batch.adj).t())
    assert torch.equal(batch.y, g.y[nodes])
