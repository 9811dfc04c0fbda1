"""Reddit (Hamilton et al. 2017) in its published GraphSAGE / PyG form.

``reddit/reddit_data.npz``: ``feature`` (N, 602) float, ``label`` (N,) int,
``node_types`` (N,) with 1 = train, 2 = val, 3 = test.
``reddit/reddit_graph.npz``: the adjacency as ``scipy.sparse.save_npz`` wrote it
(COO in the published file, CSR also accepted). Also found under PyG's layout
``Reddit/raw/``. The graph is symmetrized, self loops and duplicates dropped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ._core import DatasetError, find_dir, make_graph, missing_files_error, reading, undirected_csr

_FILES = ("reddit_data.npz", "reddit_graph.npz")
_SOURCE = (
    "Get reddit.zip (reddit_data.npz, reddit_graph.npz) from https://data.dgl.ai/dataset/reddit.zip "
    "(the file PyG's Reddit dataset downloads) and unzip it into <data root>/reddit/"
)


def reddit_files(root: Path) -> list[Path]:
    layouts = ["reddit", "reddit/raw", "."]
    folder, partial = find_dir(root, layouts, _FILES)
    if folder is None:
        raise missing_files_error("reddit", root, root / "reddit" / _FILES[0], partial, ["reddit/raw/", "./"], _SOURCE)
    return [folder / f for f in _FILES]


def load_reddit(name: str, files: list[Path]):
    import scipy.sparse as sp

    data_f, graph_f = files
    with reading(data_f):
        with np.load(data_f, allow_pickle=False) as d:
            for key in ("feature", "label", "node_types"):
                if key not in d:
                    raise DatasetError(f"{data_f} has no array '{key}' (keys: {sorted(d.keys())}); re-copy the file")
            x = np.asarray(d["feature"], dtype=np.float32)
            y = np.asarray(d["label"]).astype(np.int64).reshape(-1)
            types = np.asarray(d["node_types"]).reshape(-1)
    n = x.shape[0]
    if y.shape[0] != n or types.shape[0] != n:
        raise DatasetError(f"{data_f}: feature has {n} rows but label has {y.shape[0]} and node_types {types.shape[0]}")
    with reading(graph_f):
        adj = sp.load_npz(graph_f).tocoo()
    if adj.shape != (n, n):
        raise DatasetError(f"{graph_f}: adjacency shape {adj.shape} does not match the {n} vertices of {data_f}")
    indptr, indices, values, counts = undirected_csr(adj.row.astype(np.int64), adj.col.astype(np.int64), n)
    split = [torch.from_numpy(np.flatnonzero(types == t)) for t in (1, 2, 3)]
    return make_graph(
        name,
        indptr=indptr,
        indices=indices,
        values=values,
        x=torch.from_numpy(x),
        y=torch.from_numpy(y),
        train_idx=split[0],
        val_idx=split[1],
        test_idx=split[2],
        num_classes=int(y.max()) + 1,
        name=name,
        meta={"source": str(data_f.parent), "split": "node_types 1/2/3", **counts},
    )
