"""Bring your own graph in one step: sparse features kept sparse from the file to the
engine, the --split flag, and node data beside an edge list."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp


N, F, C = 120, 64, 3
N, F, C = 120, 64, 3
N, F, C = 120, 64, 3


def _graph_arrays(seed=0):
    """A small planted-community graph with one-hot features (density 1/F, as a
    user's sparse one-hot file) that carry the label, and a few unlabeled vertices."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, N)
    y[:5] = -1
    cols = (np.maximum(y, 0) * (F // C) + rng.integers(0, F // C, N)).astype(np.int64)
    x = sp.csr_matrix((np.ones(N, np.float32), (np.arange(N), cols)), shape=(N, F))
    src = rng.integers(0, N, 600)
    dst = np.where(rng.random(600) < 0.8, rng.permutation(src), rng.integers(0, N, 600))
    return np.stack([src, dst]), x, y


def sparse_npz(path, dense=False, x=None, **extra):
    """The graph as an npz without a split: features as CSR parts, or ``dense``."""
    ei, x_sp, y = _graph_arrays()
    x_sp = x_sp if x is None else sp.csr_matrix(x)
    feats = {"x": x_sp.toarray()} if dense else {"x_indptr": x_sp.indptr, "x_indices": x_sp.indices,
                                                 "x_data": x_sp.data, "x_shape": np.array(x_sp.shape)}
    np.savez(path, edge_index=ei, y=y, **feats, **extra)
    return path


def _record(out):
    files = sorted(out.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


@pytest.mark.parametrize("system", ["graphsage", "bns-gcn"])
def test_compared_systems_take_sparse_features_and_the_split(isolated_data, system):
    """The baselines read the same graph: CSR features (rows selected per batch), the
    --split split, both in their record."""
    import scalegnn

    path = sparse_npz(isolated_data / "g.npz")
    rec = scalegnn.train(system=system, dataset=f"npz:{path}", split="random:0.6,0.2,0.2", epochs=1, hidden=8,
                         progress=False, out_dir=str(isolated_data / "runs"))
    assert rec["status"] == "ok", rec.get("error")
    assert rec["graph"]["sparse_features"] and rec["graph"]["split"].startswith("random 60/20/20 seed 0 (--split")
