"""Files the tests write: a minimal valid run record, a configuration in schema 2's
layout, ogb datasets in ogb's own layouts, a graph of your own as an npz (CSR features,
no split), a pickle that runs code; the repository's root and the shared real data next
to it (``../shared/data``)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from scalegnn import records

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"shared data folder {SHARED_DATA} is absent")


def minimal_record(**over) -> dict:
    """A valid two-epoch ok record of the current schema; ``over`` replaces fields."""
    rec = {
        "schema_version": records.SCHEMA_VERSION, "run_id": records.new_run_id("scalegnn", "toy"), "resumed_from": None,
        "system": "scalegnn", "dataset": "toy", "config": {"epochs": 2, "model": {"hidden": 8}},
        "grid": {"dp": 1, "x": 1, "y": 1, "z": 1}, "world_size": 1, "seed": 0,
        "env": records.environment_info(), "target_acc": 0.5, "time_to_target_s": None,
        "peak_memory_bytes": 1, "status": "ok", "error": None,
        "epochs": [
            {"epoch": e, "train_time_s": 0.5 * e, "loss": 1.0 / e, "train_acc": 0.4 * e, "val_acc": 0.3 * e,
             "test_acc": 0.3 * e, "eval_time_s": 0.1, "components": {"sampling": 0.1}, "comm_bytes": {"dp": 8}}
            for e in (1, 2)
        ],
    }
    rec.update(over)
    return rec


def schema_2_config(config: dict) -> dict:
    """A run configuration (``RunConfig.to_dict()``) as schema 2 wrote it, in records and
    checkpoints: no ``numerics`` section, its settings (comm_dtype, gemm_dtype, permute)
    inside ``perf``, where they were before perf's speed-only switches were split from them."""
    old = {k: v for k, v in config.items() if k != "numerics"}
    old["perf"] = {**config["perf"], **config["numerics"]}
    return old


def assert_same_graph(a, b, same_layout: bool = True) -> None:
    """Two loaded graphs are the same graph: name, classes, every array, the features'
    layout (CSR or dense) and their stored arrays; with ``same_layout=False`` only the
    features' values (a dense PyG Cora and the loader's CSR one)."""
    assert a.name == b.name and a.num_classes == b.num_classes
    for f in ("indptr", "indices", "values", "y", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    if not same_layout:
        assert torch.equal(a.x.to_dense(), b.x.to_dense()), "x"
        return
    assert a.x.layout == b.x.layout, (a.x.layout, b.x.layout)
    parts = (lambda x: (x.crow_indices(), x.col_indices(), x.values())) if a.x.is_sparse_csr else (lambda x: (x,))
    assert all(torch.equal(p, q) for p, q in zip(parts(a.x), parts(b.x), strict=True)), "x"


def csv_gz(path, arr) -> None:
    """``arr`` (one row per item) as ogb's gzipped CSV."""
    with gzip.open(path, "wt") as f:
        np.savetxt(f, np.asarray(arr).reshape(len(arr), -1), delimiter=",", fmt="%s")


def fake_ogb_splits(d, n, rng):
    (d / "split" / "time").mkdir(parents=True)
    for s, idx in zip(("train", "valid", "test"), np.split(rng.permutation(n), [n // 2, 3 * n // 4]), strict=True):
        csv_gz(d / "split" / "time" / f"{s}.csv.gz", idx)


def ogb_folder(root, name: str) -> Path:
    """``root/<name>`` with ogb's ``raw/`` folder and the release file ogb checks offline."""
    d = Path(root) / name
    (d / "raw").mkdir(parents=True)
    (d / "RELEASE_v1.txt").write_text("fake\n")
    return d


def fake_ogbn_arxiv(root, n=30):
    """ogbn-arxiv in the exact layout ogb reads (csv.gz raw files, RELEASE_v1.txt)."""
    rng = np.random.default_rng(0)
    d = ogb_folder(root, "ogbn_arxiv")
    edges = rng.integers(0, n, (40, 2))
    csv_gz(d / "raw" / "edge.csv.gz", edges)
    csv_gz(d / "raw" / "num-node-list.csv.gz", [n])
    csv_gz(d / "raw" / "num-edge-list.csv.gz", [len(edges)])
    csv_gz(d / "raw" / "node-feat.csv.gz", rng.standard_normal((n, 4)).round(4))
    csv_gz(d / "raw" / "node_year.csv.gz", rng.integers(2000, 2020, n))
    csv_gz(d / "raw" / "node-label.csv.gz", rng.integers(0, 40, n))
    fake_ogb_splits(d, n, rng)
    return edges


def fake_ogbn_papers(root, n=20):
    """ogbn-papers100M in ogb's binary layout, with NaN labels for unlabeled papers."""
    rng = np.random.default_rng(1)
    d = ogb_folder(root, "ogbn_papers100M")
    edges = rng.integers(0, n, (2, 30))
    np.savez(
        d / "raw" / "data.npz",
        edge_index=edges,
        num_nodes_list=np.array([n]),
        num_edges_list=np.array([edges.shape[1]]),
        node_feat=rng.standard_normal((n, 3)).astype(np.float32),
        node_year=rng.integers(2000, 2020, (n, 1)),
    )
    labels = rng.integers(0, 172, n).astype(np.float32)
    labels[n // 2 :] = np.nan
    np.savez(d / "raw" / "node-label.npz", node_label=labels.reshape(n, 1))
    (d / "split" / "time").mkdir(parents=True)
    for s, idx in zip(("train", "valid", "test"), np.split(np.arange(n // 2), [4, 7]), strict=True):
        csv_gz(d / "split" / "time" / f"{s}.csv.gz", idx)
    return edges, labels


def only_record(out):
    """The one run record in folder ``out``."""
    files = sorted(out.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


# A graph of your own: N vertices, F one-hot features, C classes.
N, F, C = 120, 64, 3


def graph_arrays(seed=0):
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
    ei, x_sp, y = graph_arrays()
    x_sp = x_sp if x is None else sp.csr_matrix(x)
    feats = {"x": x_sp.toarray()} if dense else {"x_indptr": x_sp.indptr, "x_indices": x_sp.indices,
                                                 "x_data": x_sp.data, "x_shape": np.array(x_sp.shape)}
    np.savez(path, edge_index=ei, y=y, **feats, **extra)
    return path


class RunsCode:
    """Unpickling this calls ``os.system("touch <marker>")``: the marker file exists
    afterwards exactly when a loader ran code from the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))
