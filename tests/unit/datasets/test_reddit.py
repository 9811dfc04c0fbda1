"""Reddit (scalegnn/datasets/reddit.py): GraphSAGE's npz pair and its fixed split.

Every test runs with its own cache folder and with ``SCALEGNN_OFFLINE=1`` (conftest.py)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from scalegnn.datasets import load_dataset
from tests.graphs import assert_raw, stored_entries


def test_reddit_npz_pair(tmp_path):
    rng = np.random.default_rng(0)
    n = 12
    d = tmp_path / "reddit"
    d.mkdir()
    types = np.array([1] * 6 + [2] * 3 + [3] * 3)
    np.savez(d / "reddit_data.npz", feature=rng.standard_normal((n, 5)), label=np.arange(n) % 3, node_types=types)
    pairs = np.array([[0, 1], [1, 2], [2, 2], [3, 4], [4, 3], [5, 11], [0, 1]])
    sp.save_npz(d / "reddit_graph.npz", sp.csr_matrix((np.ones(len(pairs)), pairs.T), shape=(n, n)))
    g = load_dataset("reddit", data_root=tmp_path)
    assert (g.num_nodes, g.num_features, g.num_classes) == (n, 5, 3)
    assert g.num_edges == stored_entries(pairs, n) == 8
    assert torch.equal(g.val_idx, torch.tensor([6, 7, 8])) and torch.equal(g.test_idx, torch.tensor([9, 10, 11]))
    assert_raw(g)
