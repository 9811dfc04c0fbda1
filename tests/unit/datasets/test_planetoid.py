"""Planetoid (scalegnn/datasets/planetoid.py) on the real files in ``../shared/data``
(skipped when that folder is absent): published statistics and the fixes of Citeseer.
A crafted ``ind.*`` pickle: tests/unit/datasets/test_safe_pickle.py.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py)."""

from __future__ import annotations

import torch

from scalegnn.datasets import load_dataset
from tests.files import SHARED_DATA, needs_shared
from tests.graphs import assert_raw, split_sizes


# ----------------------------------------------------------- shared datasets
@needs_shared
def test_cora_matches_published_statistics():
    g = load_dataset("cora", data_root=SHARED_DATA)
    assert (g.name, g.num_nodes, g.num_edges, g.num_features, g.num_classes) == ("cora", 2708, 10556, 1433, 7)
    assert split_sizes(g) == (140, 500, 1000)
    assert torch.equal(g.train_idx, torch.arange(140)) and torch.equal(g.val_idx, torch.arange(140, 640))
    # Binary bag of words, not row-normalized, held as CSR (1.3 % ones: the layout rule).
    assert g.x.layout == torch.sparse_csr and set(torch.unique(g.x.values()).tolist()) == {1.0}
    assert bool((g.y >= 0).all())
    assert torch.bincount(g.y[g.train_idx]).tolist() == [20] * 7
    assert_raw(g)


@needs_shared
def test_citeseer_drops_self_loops_and_pads_missing_test_rows():
    g = load_dataset("citeseer", data_root=SHARED_DATA)
    # The ind.citeseer.graph dict has 9,464 neighbor entries: 124 self loops (each listed
    # twice: 248 entries) plus duplicated pairs. Without them: 4,552 undirected edges, the
    # published count, stored both ways = 9,104 (PyG's number too).
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (3327, 9104, 3703, 6)
    assert g.meta["self_loops_dropped"] == 248 and g.meta["input_edge_pairs"] == 9464
    assert split_sizes(g) == (120, 500, 1000)
    # 15 vertices in the test id range have no features in the release: zero rows, label -1,
    # in no split.
    padded = (g.y == -1).nonzero().flatten()
    assert padded.numel() == 15 and g.meta["padded_vertices"] == 15
    assert float(g.x.to_dense()[padded].abs().sum()) == 0.0
    in_splits = torch.cat([g.train_idx, g.val_idx, g.test_idx])
    assert not bool(torch.isin(padded, in_splits).any())
    assert bool((padded >= 2312).all())  # all inside the test id range (after allx)
    assert_raw(g)
