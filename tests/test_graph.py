"""Graph container: operations against dense references, and every bad input."""

import pytest
import torch

from scalegnn.graph import Graph, GraphValidationError, csr_from_edges


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
