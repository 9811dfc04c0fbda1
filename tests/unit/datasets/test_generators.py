"""Generated graphs (scalegnn/datasets/generators.py): CSBM and R-MAT are reproducible,
homophilous and heavy-tailed as asked, and bad parameters are named.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py)."""

from __future__ import annotations

import pytest
import torch

from scalegnn.datasets import DatasetError, edge_homophily, load_dataset
from tests.files import assert_same_graph
from tests.graphs import assert_raw


# ------------------------------------------------------------- generators
def test_csbm_reproducible_and_homophily():
    a = load_dataset("csbm:n=5000", seed=1)
    b = load_dataset("csbm:n=5000", seed=1, cache=False)
    c = load_dataset("csbm:n=5000", seed=2, cache=False)
    assert_same_graph(a, b)
    assert not torch.equal(a.indices, c.indices) and not torch.equal(a.x, c.x)
    assert_raw(a)
    assert torch.bincount(a.y).tolist() == [625] * 8
    # 25,000 edge draws: the in-class fraction has std sqrt(h(1-h)/25000) < 0.003, and
    # dropping repeats/loops (<1% of draws) moves it less than that; 0.02 is > 6 sigma.
    for h in (0.7, 0.2):
        g = a if h == 0.7 else load_dataset(f"csbm:n=5000,homophily={h}", seed=1, cache=False)
        assert abs(edge_homophily(g) - h) < 0.02
        assert abs(g.num_edges / g.num_nodes - 10) < 0.2  # avg_degree default 10
    # Features carry the class signal: class means are `signal` = 0.75 apart.
    means = torch.stack([a.x[a.y == k].mean(0) for k in range(8)])
    dist = torch.cdist(means, means)[~torch.eye(8, dtype=torch.bool)]
    assert abs(float(dist.mean()) - 0.75) < 0.15


def test_rmat_reproducible_and_heavy_tailed():
    a = load_dataset("rmat:scale=14,edge_factor=8", seed=0)
    b = load_dataset("rmat:scale=14,edge_factor=8", seed=0, cache=False)
    c = load_dataset("rmat:scale=14,edge_factor=8", seed=5, cache=False)
    assert_same_graph(a, b)
    assert not torch.equal(a.indptr, c.indptr)
    assert a.num_nodes == 2**14 and a.num_features == 128 and a.num_classes == 32
    deg = a.degrees().double()
    assert float(deg.max()) > 50 * float(deg.mean())  # power law: hubs (measured ~170x)
    assert_raw(a)


def test_generator_parameter_errors():
    with pytest.raises(DatasetError, match=r"unknown parameter 'nodes'; valid parameters: n \(default 10000\)"):
        load_dataset("csbm:nodes=10")
    with pytest.raises(DatasetError, match="parameter n='ten' is not an integer"):
        load_dataset("csbm:n=ten")
    with pytest.raises(DatasetError, match="homophily=1.5 must be in"):
        load_dataset("csbm:homophily=1.5")
    with pytest.raises(DatasetError, match="must be 1"):
        load_dataset("rmat:a=0.9")
    with pytest.raises(DatasetError, match="cora takes no parameters"):
        load_dataset("cora:n=3")
