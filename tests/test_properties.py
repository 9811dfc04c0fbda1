"""Property-based tests (hypothesis) over hostile random graphs and random grids.

Graphs are drawn with everything real data throws at a loader: empty rows
(isolated vertices), self loops, duplicate edges, one-directional edges,
non-contiguous vertex ids, comments, headers and extra columns in edge lists.
Properties checked against dense references built independently here:

- ``csr_from_edges`` / ``Graph.symmetrize``: sorted, duplicate-free CSR whose
  pattern is exactly the edge set (resp. its symmetric closure);
- ``Graph.gcn_normalize``: equals D^-1/2 (A+I) D^-1/2 computed densely in float64;
  finite, and every isolated vertex gets exactly its self loop (weight 1);
- loaders (``edgelist:`` files, ``npz:`` arrays): the graph is the undirected,
  self-loop-free pattern of the input over the renumbered ids; or a DatasetError
  (a ValueError with a message), never another exception;
- the sampler: a sorted unique sample of B vertices; the sampled matrix is the
  induced subgraph of the normalized A with off-diagonal entries divided by
  p = (B-1)/(N-1) (Eq. 24); and over random 4D grids (including axes longer than
  the graph, so some shards are empty), the rank shards tile that matrix exactly.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scalegnn.datasets import DatasetError, load_dataset
from scalegnn.graph import Graph, csr_from_edges
from scalegnn.parallel.grid import PMM_AXES
from scalegnn.sampling import UniformVertexSampler, inclusion_probability
from tests.graphs import tile_rank_samples

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def edge_lists(draw, max_nodes: int = 14, max_edges: int = 40, min_nodes: int = 1):
    """(n, edges): ids in [0, n), with self loops, duplicates and one-way edges likely."""
    n = draw(st.integers(min_nodes, max_nodes))
    node = st.integers(0, n - 1)
    base = draw(st.lists(st.tuples(node, node), max_size=max_edges))
    loops = draw(st.lists(node, max_size=3))
    dups = draw(st.lists(st.sampled_from(base), max_size=5)) if base else []
    edges = base + [(v, v) for v in loops] + dups
    return n, draw(st.permutations(edges))


def make_graph(n: int, edges, symmetric: bool = True, features: int = 3) -> Graph:
    src = torch.tensor([u for u, _ in edges], dtype=torch.int64)
    dst = torch.tensor([v for _, v in edges], dtype=torch.int64)
    gen = torch.Generator().manual_seed(n * 1000 + len(edges))
    every = torch.arange(n)
    g = Graph(torch.zeros(n + 1, dtype=torch.long), [], [], torch.randn(n, features, generator=gen),
              torch.randint(0, 3, (n,), generator=gen), every, every, every, 3).with_edges(src, dst)
    return g.symmetrize() if symmetric else g


def dense_pattern(n: int, edges, symmetric: bool) -> torch.Tensor:
    a = torch.zeros(n, n, dtype=torch.float64)
    for u, v in edges:
        a[u, v] = 1.0
        if symmetric:
            a[v, u] = 1.0
    return a


def assert_csr_invariants(g: Graph) -> None:
    n = g.num_nodes
    assert g.indptr[0] == 0 and g.indptr[-1] == g.indices.numel()
    assert bool((g.indptr[1:] >= g.indptr[:-1]).all())
    for r in range(n):
        row = g.indices[g.indptr[r]: g.indptr[r + 1]]
        assert bool((row[1:] > row[:-1]).all()), f"row {r} not strictly increasing: {row}"
        assert bool(((row >= 0) & (row < n)).all())


# ----------------------------------------------------------------------------- graph and normalization
@SETTINGS
@given(edge_lists(), st.booleans())
def test_csr_and_symmetrize_hold_exactly_the_edge_set(data, symmetric):
    n, edges = data
    g = make_graph(n, edges, symmetric=symmetric)
    assert_csr_invariants(g)
    got = {(int(r), int(c)) for r, c in zip(g.row_ids(), g.indices)}
    want = set(edges) | ({(v, u) for u, v in edges} if symmetric else set())
    assert got == want
    assert bool((g.values == 1).all())  # duplicates merged, not summed (unweighted)
    indptr, indices, values = csr_from_edges([u for u, _ in edges], [v for _, v in edges], n,
                                             values=[1.0] * len(edges))
    weights = {}
    for e in edges:
        weights[e] = weights.get(e, 0.0) + 1.0  # weighted input: duplicates summed
    rows = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    assert {(int(r), int(c)): float(v) for r, c, v in zip(rows, indices, values)} == weights


@SETTINGS
@given(edge_lists(), st.booleans())
def test_gcn_normalization_matches_the_dense_formula(data, symmetric):
    n, edges = data
    g = make_graph(n, edges, symmetric=symmetric).gcn_normalize()
    assert_csr_invariants(g)
    a = dense_pattern(n, edges, symmetric)
    a.fill_diagonal_(1.0)  # A + I: a missing self loop is added, an existing one kept (weight 1)
    d = a.sum(1)
    ref = a / torch.sqrt(d[:, None] * d[None, :])
    got = g.to_torch_csr().to_dense().double()
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)
    assert bool(torch.isfinite(g.values).all())
    isolated = (dense_pattern(n, edges, symmetric).fill_diagonal_(0).sum(1) == 0).nonzero().flatten()
    for v in isolated.tolist():
        assert got[v, v] == 1.0 and got[v].abs().sum() == 1.0
    if symmetric:
        assert torch.equal(got, got.t())


# ----------------------------------------------------------------------------- loaders
@st.composite
def edge_list_files(draw):
    """Text of an edge list with random ids (not contiguous), comments, a header,
    blank lines, comma or whitespace separators and extra columns."""
    ids = draw(st.lists(st.integers(0, 10_000), min_size=1, max_size=12, unique=True))
    pair = st.tuples(st.sampled_from(ids), st.sampled_from(ids))
    edges = draw(st.lists(pair, min_size=1, max_size=30))
    sep = draw(st.sampled_from([" ", "\t", ",", "  "]))
    lines = []
    if draw(st.booleans()):
        lines.append(draw(st.sampled_from(["# a comment", "% matrix-ish comment", "# src dst"])))
    if draw(st.booleans()):
        lines.append(f"source{sep}target")
    for u, v in edges:
        extra = draw(st.sampled_from(["", f"{sep}1.5", f"{sep}7{sep}x"]))
        lines.append(f"{u}{sep}{v}{extra}")
        if draw(st.integers(0, 9)) == 0:
            lines.append("")
    return "\n".join(lines) + "\n", edges


def _undirected_without_loops(edges, relabel) -> set:
    out = set()
    for u, v in edges:
        if u != v:
            out |= {(relabel[u], relabel[v]), (relabel[v], relabel[u])}
    return out


@SETTINGS
@given(edge_list_files())
def test_edge_list_loader_gives_the_undirected_loop_free_graph_or_a_clear_error(data):
    text, edges = data
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.txt"
        path.write_text(text)
        try:
            g = load_dataset(f"edgelist:{path}", data_root=tmp, cache=False)
        except DatasetError as exc:  # e.g. too few vertices for a train/val/test split
            assert str(exc) and not isinstance(exc, (KeyError, IndexError))
            return
    distinct = sorted({x for e in edges for x in e})
    relabel = {old: new for new, old in enumerate(distinct)}
    assert g.num_nodes == len(distinct)
    assert_csr_invariants(g)
    assert {(int(r), int(c)) for r, c in zip(g.row_ids(), g.indices)} == _undirected_without_loops(edges, relabel)


@SETTINGS
@given(edge_lists(min_nodes=3), st.booleans(), st.booleans())
def test_npz_loader_keeps_isolated_vertices_and_cleans_edges(data, transpose, float_labels):
    n, edges = data
    rng = np.random.default_rng(n)
    y = rng.integers(0, 3, n)
    y[0] = 2
    arrays = {"x": rng.standard_normal((n, 4)).astype(np.float32),
              "y": y.astype(np.float64) if float_labels else y,
              "train_idx": np.arange(n), "val_idx": np.arange(n), "test_idx": np.arange(n)}
    ei = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    # (E, 2) is accepted too, except when E == 2, where (2, E) is the documented reading
    arrays["edge_index"] = ei if transpose and len(edges) != 2 else ei.T
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.npz"
        np.savez(path, **arrays)
        try:
            g = load_dataset(f"npz:{path}", data_root=tmp, cache=False)
        except DatasetError as exc:
            assert len(edges) == 0 or "edge" in str(exc), exc  # an empty edge list may be refused, clearly
            return
    assert g.num_nodes == n  # vertices come from x: isolated ones are kept
    assert_csr_invariants(g)
    want = _undirected_without_loops(edges, {v: v for v in range(n)})
    assert {(int(r), int(c)) for r, c in zip(g.row_ids(), g.indices)} == want


# ----------------------------------------------------------------------------- sampler
def _dense(csr) -> torch.Tensor:
    return csr.to_dense()


@SETTINGS
@given(edge_lists(min_nodes=2, max_nodes=20, max_edges=60), st.data())
def test_sample_is_the_rescaled_induced_subgraph(data, draw):
    n, edges = data
    g = make_graph(n, edges).gcn_normalize()
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


grid_shapes = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edge_lists(min_nodes=2, max_nodes=16, max_edges=50), grid_shapes, st.data())
def test_rank_shards_tile_the_serial_sample_on_random_grids(data, shape, draw):
    """Communication-free sampling on every rank of a random 4D grid (virtual ranks:
    sampling needs no process group). Axes may be longer than N: empty shards."""
    n, edges = data
    world = shape[0] * shape[1] * shape[2] * shape[3]
    assume(world > 1)
    g = make_graph(n, edges).gcn_normalize()
    b = draw.draw(st.integers(2, n), label="B")
    seed, step = draw.draw(st.integers(0, 1000), label="seed"), draw.draw(st.integers(0, 1000), label="step")
    for dp in range(shape[0]):
        ref, planes, ranks = tile_rank_samples(g, shape, b, seed, step, dp)
        for _, sb in ranks:
            for ax in PMM_AXES:
                lo, hi = sb.rows.block(ax)
                assert torch.equal(sb.y[ax], ref.y[lo:hi])
        dense = _dense(ref.adj)
        for p in range(3):
            assert torch.equal(planes[p], dense), f"plane {p}, grid {shape}, B={b}"


def test_hypothesis_is_installed():
    pytest.importorskip("hypothesis")
