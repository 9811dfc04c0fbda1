"""The graph container (scalegnn/graph.py): operations against dense references, every
bad input, features kept sparse, and properties over hostile random graphs (hypothesis).

Random graphs are drawn with everything real data throws at a loader: empty rows
(isolated vertices), self loops, duplicate edges, one-directional edges. Checked
against dense references built independently here: ``csr_from_edges`` /
``Graph.symmetrize`` give a sorted, duplicate-free CSR whose pattern is exactly the
edge set (resp. its symmetric closure); ``Graph.gcn_normalize`` equals
D^-1/2 (A+I) D^-1/2 computed densely in float64, finite, and every isolated vertex gets
exactly its self loop (weight 1). The loaders' properties are in
tests/unit/datasets/test_files.py, the sampler's in tests/unit/test_sampling.py and
tests/parallel/test_dist_sampling.py.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given
from hypothesis import strategies as st

from scalegnn.graph import Graph, GraphValidationError, csr_from_edges
from tests.graphs import assert_csr_invariants, random_graph
from tests.strategies import SETTINGS, edge_lists, graph_of


def make_graph(n=6, edges=((0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0), (0, 3)), **over):
    src = torch.tensor([e[0] for e in edges])
    dst = torch.tensor([e[1] for e in edges])
    indptr, indices, values = csr_from_edges(src, dst, n)
    fields = dict(
        indptr=indptr, indices=indices, values=values, x=torch.arange(n * 3, dtype=torch.float32).view(n, 3),
        y=torch.arange(n) % 2, train_idx=[0, 1], val_idx=[2, 3], test_idx=[4, 5], num_classes=2, name="toy",
    )
    fields.update(over)
    return Graph(**fields)


def dense(g: Graph) -> torch.Tensor:
    return g.to_torch_csr().to_dense()


def test_csr_from_edges_sorts_and_merges_duplicates():
    indptr, indices, values = csr_from_edges([2, 0, 0, 2], [1, 2, 1, 1], 3, values=[1.0, 2.0, 3.0, 4.0])
    assert indptr.tolist() == [0, 2, 2, 3]
    assert indices.tolist() == [1, 2, 1]
    assert values.tolist() == [3.0, 2.0, 5.0]  # (2,1) appeared twice: 1 + 4


def test_symmetrize_self_loops_and_gcn_normalization_match_dense_formula():
    g = make_graph()
    a = dense(g)
    sym = dense(g.symmetrize())
    assert torch.equal(sym, ((a + a.T) > 0).float())
    norm = g.symmetrize().gcn_normalize()
    a_hat = sym + torch.eye(6)
    d = a_hat.sum(1).rsqrt()
    assert torch.allclose(dense(norm), d[:, None] * a_hat * d[None, :], atol=1e-7)
    assert norm.meta["normalized"] == "gcn"
    # existing self loops are not doubled
    twice = norm.add_self_loops()
    assert twice.num_edges == norm.num_edges


def test_permute_moves_everything_consistently():
    g = make_graph().symmetrize().gcn_normalize()
    perm = torch.tensor([3, 5, 0, 1, 4, 2])
    p = g.permute(perm)
    assert torch.allclose(dense(p), dense(g)[perm][:, perm])
    assert torch.equal(p.x, g.x[perm]) and torch.equal(p.y, g.y[perm])
    inverse = torch.argsort(perm)
    assert sorted(perm[p.train_idx].tolist()) == g.train_idx.tolist()
    assert torch.allclose(dense(p.permute(inverse)), dense(g))


def test_induced_subgraph():
    g = make_graph().symmetrize()
    nodes = torch.tensor([0, 3, 4])
    s = g.subgraph(nodes)
    assert torch.equal(dense(s), dense(g)[nodes][:, nodes])
    assert torch.equal(s.x, g.x[nodes])
    assert s.train_idx.tolist() == [0] and s.val_idx.tolist() == [1] and s.test_idx.tolist() == [2]


@pytest.mark.parametrize(
    "over, message",
    [
        (dict(indices=torch.tensor([0, 9, 1, 2, 3, 4, 5])), "out of range"),
        (dict(x=torch.zeros(5, 3)), "N=6 rows"),
        (dict(y=torch.zeros(4, dtype=torch.long)), "labels have 4 rows"),
        (dict(y=torch.tensor([0, 1, 2, 0, 1, 0])), "num_classes=2"),
        (dict(x=torch.tensor([[0.0, float("nan"), 0]] + [[0.0, 0, 0]] * 5)), "NaN or inf"),
        (dict(x=torch.tensor([[0.0, float("inf"), 0]] + [[0.0, 0, 0]] * 5)), "NaN or inf"),
        (dict(val_idx=[]), "val_idx is empty"),
        (dict(train_idx=[0, 7]), "outside"),
        (dict(y=torch.tensor([-1, 1, 0, 1, 0, 1])), "unlabeled"),
        (dict(indptr=torch.tensor([0, 2, 1, 3, 4, 6, 7])), "non-decreasing"),
    ],
)
def test_bad_inputs_raise_clear_errors(over, message):
    with pytest.raises(GraphValidationError, match=message):
        make_graph(**over)


def test_non_square_and_out_of_range_edge_lists_rejected():
    with pytest.raises(GraphValidationError, match="must be square"):
        csr_from_edges([0], [1], 3, num_cols=4)
    with pytest.raises(GraphValidationError, match="edge target id 5 is out of range"):
        csr_from_edges([0], [5], 3)
    with pytest.raises(GraphValidationError, match="must hold integers"):
        csr_from_edges(torch.tensor([0.5]), torch.tensor([1]), 3)


# ----------------------------------------------------------------------------- sparse features
def _csr(rows, cols, vals, shape):
    """A torch CSR tensor holding exactly the given entries (rows non-decreasing), in
    their order, duplicates and zeros included: no canonical form imposed."""
    ptr = torch.zeros(shape[0] + 1, dtype=torch.int64)
    ptr[1:] = torch.cumsum(torch.bincount(torch.tensor(rows, dtype=torch.int64), minlength=shape[0]), 0)
    return torch.sparse_csr_tensor(ptr, torch.tensor(cols), torch.tensor(vals), shape, check_invariants=False)


def _tiny(x, n=4):
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3])
    g = Graph(torch.zeros(n + 1, dtype=torch.long), [], [], x, torch.tensor([0, 1, 0, 1]), [0, 1], [2], [3], 2)
    return g.with_edges(src, dst).symmetrize()


def test_graph_keeps_a_sparse_x_sparse_and_canonical():
    """Unsorted columns, a duplicate entry and an explicit zero: the graph holds the
    canonical float32 CSR (sorted, duplicates summed, zero dropped); COO, scipy and
    integer input become the same; permute and subgraph keep it CSR and equal the dense."""
    rows, cols, vals = [0, 0, 0, 2, 2, 3], [3, 1, 1, 0, 2, 4], [1.0, 2.0, 3.0, 0.0, 4.0, 5.0]
    dense = torch.zeros(4, 5)
    for r, c, v in zip(rows, cols, vals):
        dense[r, c] += v
    g = _tiny(_csr(rows, cols, vals, (4, 5)))
    assert g.x.layout == torch.sparse_csr and g.x.dtype == torch.float32 and g.x.col_indices().dtype == torch.int64
    assert g.x.crow_indices().tolist() == [0, 2, 2, 3, 4] and g.x.col_indices().tolist() == [1, 3, 2, 4]
    assert g.x.values().tolist() == [5.0, 1.0, 4.0, 5.0]
    for other in (dense.to_sparse(), sp.csr_matrix(dense.numpy()), dense.to(torch.int64).to_sparse_csr()):
        x = _tiny(other).x
        assert x.layout == torch.sparse_csr and torch.equal(x.to_dense(), dense)
    perm = torch.tensor([2, 0, 3, 1])
    assert torch.equal(g.permute(perm).x.to_dense(), _tiny(dense).permute(perm).x)
    sub = g.subgraph(torch.tensor([3, 0, 2]))
    assert sub.x.layout == torch.sparse_csr and torch.equal(sub.x.to_dense(), dense[[3, 0, 2]])
    assert g.stats()["sparse_features"] and g.record_info()["sparse_features"]


@pytest.mark.parametrize("x, message", ids=["rows", "column", "nan", "complex"], argvalues=[
    (lambda: _csr([0, 1], [0, 1], [1.0, 1.0], (3, 2)), r"features must be an \(N, F\) matrix with N=4 rows"),
    (lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 1, 1, 2]), torch.tensor([0, 7]), torch.tensor([1., 1.]),
                                     (4, 3), check_invariants=False), r"column id 7 is outside \[0, 3\)"),
    (lambda: _csr([1], [0], [float("nan")], (4, 2)), r"NaN or inf \(first at row 1\)"),
    (lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 1, 1, 1]), torch.tensor([0]),
                                     torch.tensor([1 + 1j]), (4, 2)), "real values"),
])
def test_graph_refuses_a_bad_sparse_x_in_one_line(x, message):
    with pytest.raises(GraphValidationError, match=message) as err:
        _tiny(x())
    assert "\n" not in str(err.value)


def test_from_pyg_keeps_a_sparse_x_sparse():
    from torch_geometric.data import Data

    x = torch.zeros(4, 6)
    x[0, 5] = x[3, 1] = 1.0
    data = Data(x=x.to_sparse_csr(), y=torch.tensor([0, 1, 0, 1]), edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]))
    g = Graph.from_pyg(data)
    assert g.x.layout == torch.sparse_csr and torch.equal(g.x.to_dense(), x)


# ----------------------------------------------------------------------------- properties (hypothesis)
def dense_pattern(n: int, edges, symmetric: bool) -> torch.Tensor:
    a = torch.zeros(n, n, dtype=torch.float64)
    for u, v in edges:
        a[u, v] = 1.0
        if symmetric:
            a[v, u] = 1.0
    return a


# ----------------------------------------------------------------------------- graph and normalization
@SETTINGS
@given(edge_lists(), st.booleans())
def test_csr_and_symmetrize_hold_exactly_the_edge_set(data, symmetric):
    n, edges = data
    g = graph_of(n, edges, symmetric=symmetric)
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
    g = graph_of(n, edges, symmetric=symmetric).gcn_normalize()
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


def test_hypothesis_is_installed():
    pytest.importorskip("hypothesis")


def test_a_graph_prints_its_sizes_in_one_line():
    g = Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 3]]), torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))
    assert repr(g) == "Graph('graph', num_nodes=4, num_edges=6, x=(4, 3), y=(4,), num_classes=2, train/val/test=2/1/1)"
    norm = g.gcn_normalize()
    assert repr(norm).endswith(", normalized)") and "\n" not in repr(norm) and "tensor" not in repr(norm)


def test_from_edge_index_and_from_scipy_build_the_graph_from_pyg_builds():
    """The same edges, features, labels and masks give the same graph whichever door
    they come in by: PyG's Data, a (2, E) edge_index, a 0/1 scipy matrix; a scipy matrix's
    values are the edge weights."""
    rng = np.random.default_rng(3)
    src, dst = rng.integers(0, 30, 90), rng.integers(0, 30, 90)
    x, y = torch.randn(30, 5), torch.as_tensor(rng.integers(0, 3, 30))
    masks = [torch.as_tensor(rng.random(30) < p) for p in (0.5, 0.3, 0.2)]
    edge_index = torch.as_tensor(np.stack([src, dst]))
    want = Graph.from_pyg(SimpleNamespace(edge_index=edge_index, x=x, y=y, train_mask=masks[0], val_mask=masks[1],
                                          test_mask=masks[2]))
    by_index = Graph.from_edge_index(edge_index.numpy(), x, y, train_mask=masks[0], val_mask=masks[1],
                                     test_mask=masks[2])
    adjacency = sp.coo_matrix((np.ones(90), (src, dst)), shape=(30, 30))
    by_scipy = Graph.from_scipy(adjacency, x, y, train_mask=masks[0].numpy(), val_mask=masks[1].numpy(),
                                test_mask=masks[2].numpy())
    weighted = Graph.from_scipy(sp.coo_matrix((rng.random(90) + 2, (src, dst)), shape=(30, 30)), x, y)
    assert weighted.meta["weighted"] and "weighted" not in by_scipy.meta
    assert torch.equal(weighted.indices, want.indices) and bool((weighted.values > 2).all())
    for g in (by_index, by_scipy):
        for name in ("indptr", "indices", "values", "x", "y", "train_idx", "val_idx", "test_idx"):
            assert torch.equal(getattr(g, name), getattr(want, name)), name
        assert g.meta["split"] == "the masks given"
    assert by_scipy.meta["source"] == "coo_matrix" and by_index.meta["source"] == "edge_index"
    seeded = Graph.from_edge_index(edge_index, x, y, seed=4)
    assert seeded.meta["split"] == "random 50/25/25 seed 4 (no masks given)"
    with pytest.raises(GraphValidationError, match="give train_mask, val_mask and test_mask together"):
        Graph.from_edge_index(edge_index, x, y, train_mask=masks[0])
    with pytest.raises(GraphValidationError, match=r"square scipy sparse matrix, got shape \(30, 31\)"):
        Graph.from_scipy(sp.coo_matrix((30, 31)), x, y)


def test_validation_reads_the_features_once_on_the_way_to_the_normalized_graph(monkeypatch):
    """Loading, adding self loops and normalizing build three graphs; the features (and
    multi-hot labels) are scanned for NaN once, by the first. A derived graph given new
    features scans those."""
    import torch

    from tests.graphs import random_graph

    g = random_graph(n=50, m=200, seed=2)
    graph = Graph(g.indptr, g.indices, g.values, g.x.clone(), g.y, g.train_idx, g.val_idx, g.test_idx, g.num_classes)
    scanned = []
    real = torch.isfinite

    def counting(t, *args, **kwargs):
        scanned.append(t)
        return real(t, *args, **kwargs)

    monkeypatch.setattr(torch, "isfinite", counting)
    normalized = graph.gcn_normalize()
    assert normalized.x is graph.x and not any(t is graph.x for t in scanned)
    bad = graph.x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(GraphValidationError, match="features contain NaN or inf"):
        normalized.replace(x=bad)


# ---------------------------------------------------------------- the graph as passed
def _cora_like(seed: int = 0, n: int = 40, m: int = 160):
    """A PyG-shaped object: a symmetric edge_index without self loops, features, labels."""
    g = random_graph(n=n, m=m, seed=seed)
    rows = g.row_ids()
    keep = rows != g.indices  # the normalized graph's self loops
    return SimpleNamespace(edge_index=torch.stack([rows[keep], g.indices[keep]]), x=g.x, y=g.y)


def _dense(g: Graph) -> torch.Tensor:
    return g.to_torch_csr().to_dense()


def test_edge_weights_are_the_gcn_normalizations_weights_as_pygs_gcn_norm():
    """edge_weight of a PyG object is used: the normalized adjacency is PyG's gcn_norm of
    the weighted graph (self loops of weight 1), not the unweighted one."""
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    data = _cora_like()
    src, dst = data.edge_index
    w = torch.rand(src.numel(), generator=torch.Generator().manual_seed(0)) + 0.5
    data.edge_weight = (w + w[_reverse_positions(src, dst)]) / 2  # symmetric weights: A = A^T
    g = Graph.from_pyg(data)
    assert g.meta["weighted"] is True and "symmetrized" not in g.meta
    ei, ew = gcn_norm(data.edge_index, data.edge_weight, num_nodes=g.num_nodes, add_self_loops=True)
    want = torch.sparse_coo_tensor(ei.flip(0), ew, (g.num_nodes,) * 2).to_dense()  # row = target, as PyG sums
    assert torch.allclose(_dense(g.gcn_normalize()), want, atol=1e-6)
    plain = Graph.from_pyg(_cora_like())
    assert not torch.allclose(_dense(plain.gcn_normalize()), want, atol=1e-3)
    data.edge_weight = torch.ones(src.numel())  # all ones: the unweighted graph, which every system trains
    assert "weighted" not in Graph.from_pyg(data).meta


def _reverse_positions(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """For each edge (s, d) of a symmetric edge list, the position of (d, s)."""
    key = {(int(s), int(d)): k for k, (s, d) in enumerate(zip(src, dst))}
    return torch.tensor([key[(int(d), int(s))] for s, d in zip(src, dst)])


def test_a_directed_edge_index_is_made_undirected_and_said_so(caplog):
    """One direction of each edge: the undirected graph is trained, a warning says so, and
    meta (so the record) carries symmetrized with the input's edge count; an undirected
    input says nothing."""
    data = _cora_like()
    src, dst = data.edge_index
    with caplog.at_level("WARNING", logger="scalegnn"):
        full = Graph.from_pyg(data)
        assert "not symmetric" not in caplog.text
        data.edge_index = data.edge_index[:, src < dst]
        half = Graph.from_pyg(data, name="half")
    assert torch.equal(half.indices, full.indices) and torch.equal(half.indptr, full.indptr)
    assert half.meta["symmetrized"] is True and half.meta["input_edges"] == int((src < dst).sum())
    info = half.record_info()
    assert info["symmetrized"] is True and info["input_edges"] == int((src < dst).sum())
    assert info["num_edges"] == full.num_edges and "symmetrized" not in full.record_info()
    said = [r.getMessage() for r in caplog.records if "not symmetric" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"half: the edges given are not symmetric ({half.meta['input_edges']}")


def test_weighted_symmetrizing_takes_the_mean_of_the_directions_given():
    """(0, 1) given one way weighs the same both ways; (1, 2) given both ways with 3 and 5
    weighs 4; duplicates sum; self loops dropped."""
    edge_index = torch.tensor([[0, 1, 2, 3, 3, 2], [1, 2, 1, 2, 2, 2]])
    g = Graph.from_edge_index(edge_index, torch.ones(4, 1), torch.tensor([0, 1, 0, 1]),
                              edge_weight=torch.tensor([2.0, 3.0, 5.0, 1.0, 1.5, 9.0]))
    want = torch.zeros(4, 4)
    want[0, 1] = want[1, 0] = 2.0
    want[1, 2] = want[2, 1] = 4.0
    want[3, 2] = want[2, 3] = 2.5
    assert torch.equal(_dense(g), want) and g.meta["symmetrized"] and g.meta["weighted"]


@pytest.mark.parametrize("bad, message", [
    (lambda n: torch.ones(100, dtype=torch.bool), "boolean mask of shape (100,) but the graph has 40 vertices"),
    (lambda n: torch.zeros(n, dtype=torch.long).index_fill_(0, torch.arange(5), 1), "more than once"),
    (lambda n: torch.ones(n), "dtype torch.float32"),
    (lambda n: torch.tensor([3, 45]), "outside [0, 40)"),
])
def test_a_mask_that_is_neither_a_boolean_mask_nor_vertex_ids_is_refused(bad, message):
    data = _cora_like()
    n = data.x.shape[0]
    data.train_mask, data.val_mask, data.test_mask = bad(n), torch.arange(10, 20), torch.arange(20, 40)
    with pytest.raises(GraphValidationError, match=re.escape(message)):
        Graph.from_pyg(data)


def test_index_masks_are_read_as_vertex_ids_boolean_ones_as_masks():
    """train_mask = arange(30, 35) trains vertices 30..34 (the old reading took their
    nonzero positions, 0..4); a boolean mask and PyG's (N, k) masks are read as masks."""
    data = _cora_like()
    data.train_mask, data.val_mask = torch.arange(30, 35), torch.tensor([7, 3, 5])
    test = torch.zeros(40, dtype=torch.bool)
    test[10:20] = True
    data.test_mask = test
    g = Graph.from_pyg(data)
    assert g.train_idx.tolist() == [30, 31, 32, 33, 34] and g.val_idx.tolist() == [3, 5, 7]
    assert g.test_idx.tolist() == list(range(10, 20))
    by_index = Graph.from_edge_index(data.edge_index, data.x, data.y, train_mask=torch.arange(30, 35),
                                     val_mask=[3, 5, 7], test_mask=test.numpy())
    assert torch.equal(by_index.train_idx, g.train_idx) and torch.equal(by_index.test_idx, g.test_idx)


def test_edge_attr_is_refused_not_dropped():
    data = _cora_like()
    data.edge_attr = torch.ones(data.edge_index.shape[1], 8)
    with pytest.raises(GraphValidationError, match=r"edge_attr of shape \(\d+, 8\).*edge_weight.*del data.edge_attr"):
        Graph.from_pyg(data)
    data.edge_attr = None
    data.edge_weight = -torch.ones(data.edge_index.shape[1])
    with pytest.raises(GraphValidationError, match="negative weight"):
        Graph.from_pyg(data)
