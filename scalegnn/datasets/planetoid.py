"""Planetoid citation graphs (Cora, CiteSeer, PubMed) with the standard split.

Files ``ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}`` (Yang et al. 2016):
pickles written by Python 2 (read with ``encoding='latin1'``) of scipy CSR matrices,
numpy arrays and a ``defaultdict`` of lists. They are read by a restricted unpickler
that admits only those types (:mod:`scalegnn.datasets.safe_pickle`), so a crafted file
is refused instead of running code. ``allx``/``ally``
hold vertices 0..len(allx)-1; ``tx``/``ty`` row i belongs to vertex
``test.index[i]`` (not contiguous, not sorted); ``graph`` maps a vertex to its
neighbor list.

Decisions (same outcome as PyG's ``Planetoid`` except where noted):

- Self loops and duplicate pairs in ``graph`` are dropped (CiteSeer has 124 self
  loops, Cora some duplicate pairs); the graph is symmetrized (it already is).
- CiteSeer has 15 vertices in the test id range with no ``tx`` row (isolated
  papers missing from the original release). They get zero feature rows, like
  PyG and Kipf & Welling, but label **-1** (unlabeled) where PyG and Kipf give
  them class 0 (argmax of an all-zero one-hot row). They are in no split.
- Split: train = range(len(y)) (20 per class), val = range(len(y), len(y)+500),
  test = sorted(test.index) (1000 vertices).
- Features are the binary bag-of-words as stored (PubMed: TF-IDF), not
  row-normalized, assembled from the files' CSR rows without a dense copy and held
  in the layout of the one feature rule (:func:`scalegnn.csr.sparse_enough`): CSR
  for Cora (1.3 % ones) and CiteSeer (0.9 %), dense for PubMed (10 %).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from scalegnn.csr import csr_matrix, feature_layout
from scalegnn.fileio import check_declared_size

from ._core import DatasetError, find_dir, make_graph, missing_files_error, reading, undirected_csr
from .safe_pickle import PLANETOID_TYPES, load_pickle

PLANETOID = ("cora", "citeseer", "pubmed")
_PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
_SOURCE = "https://github.com/kimiyoung/planetoid (data/ind.{n}.*)"


def planetoid_files(name: str, root: Path) -> list[Path]:
    """The 8 ind.<name>.* files, from the first accepted layout under ``root``."""
    required = [f"ind.{name}.{p}" for p in _PARTS]
    layouts = [f"planetoid_{name}", f"{name}/raw", name, f"planetoid/{name}", "."]
    folder, partial = find_dir(root, layouts, required)
    if folder is None:
        raise missing_files_error(
            name,
            root,
            root / f"planetoid_{name}" / required[0],
            partial,
            [f"{lay}/ind.{name}.*" for lay in layouts[1:]],
            f"Get the Planetoid files from {_SOURCE.format(n=name)}",
        )
    return [folder / f for f in required]


def _fix(name: str) -> str:
    return f"replace it with the original from {_SOURCE.format(n=name)}"


def _unpickle(path: Path, name: str):
    return load_pickle(path, PLANETOID_TYPES, "a Planetoid ind.* file", _fix(name), encoding="latin1")


def _checked_matrix(path: Path, m, name: str):
    """``m``, one file's matrix, as the file holds it (a scipy CSR or a dense array),
    checked before use (inside the file's ``reading`` context): a CSR's arrays are
    validated and its shape must pass a memory budget as a dense matrix (the real files
    are megabytes); anything else must be a 2-D numeric array."""
    if isinstance(m, sp.csr_matrix):
        m.check_format(full_check=True)  # its arrays came from the file: validate before use
        check_declared_size(str(path), f"its CSR matrix's shape {m.shape} (dense rows x columns)",
                            m.shape[0] * m.shape[1], 4, fix=_fix(name), error=DatasetError)
        return m
    if not isinstance(m, np.ndarray) or m.ndim != 2 or m.dtype.hasobject:
        raise ValueError(f"expected a 2-D numeric matrix, got {type(m).__name__} {getattr(m, 'shape', '')}")
    return m


def _feature_rows(path: Path, m, name: str) -> sp.csr_matrix:
    """A feature matrix of one file (CSR or dense) as a float32 scipy CSR matrix, never densified."""
    with reading(path, _fix(name)):
        m = _checked_matrix(path, m, name)
        return m.astype(np.float32) if isinstance(m, sp.csr_matrix) else sp.csr_matrix(np.asarray(m, np.float32))


def _matrix(path: Path, m, name: str) -> np.ndarray:
    """A one-hot label matrix (CSR or dense) of one file, as dense float32 (features: :func:`_feature_rows`)."""
    with reading(path, _fix(name)):
        m = _checked_matrix(path, m, name)
        return np.asarray(m.toarray() if isinstance(m, sp.csr_matrix) else m, dtype=np.float32)


def _adjacency_lists(path: Path, graph, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``graph`` ({vertex: [neighbors]}) as (src, dst) int64 arrays."""
    with reading(path, _fix(name)):
        if not isinstance(graph, dict) or not all(type(k) is int and isinstance(nb, list) for k, nb in graph.items()):
            raise ValueError("expected a dict of vertex id -> list of neighbor ids (ints)")
        # (A pickle whose rows share one memoized list was refused by load_pickle: expanded_size.)
        if not all(type(v) is int for nb in graph.values() for v in nb):
            raise ValueError("expected a dict of vertex id -> list of neighbor ids (ints)")
        src = np.fromiter((k for k, nb in graph.items() for _ in nb), dtype=np.int64)
        dst = np.fromiter((v for nb in graph.values() for v in nb), dtype=np.int64)
        if (src.size and src.min() < 0) or (dst.size and dst.min() < 0):
            raise ValueError(f"a negative vertex id {min(src.min(), dst.min())}; ids are >= 0")
    return src, dst


def _onehot_to_label(m: np.ndarray) -> np.ndarray:
    lab = m.argmax(1).astype(np.int64)
    lab[m.sum(1) == 0] = -1
    return lab


def load_planetoid(name: str, files: list[Path]):
    parts = dict(zip(_PARTS, files, strict=True))
    obj = {p: _unpickle(parts[p], name) for p in _PARTS if p != "test.index"}
    with reading(parts["test.index"], _fix(name)):
        test_index = np.loadtxt(parts["test.index"], dtype=np.int64, ndmin=1)
        if not test_index.size or test_index.min() < 0:
            raise ValueError("expected one vertex id >= 0 per line")

    allx, tx = (_feature_rows(parts[p], obj[p], name) for p in ("allx", "tx"))
    ally, ty, y_train = (_matrix(parts[p], obj[p], name) for p in ("ally", "ty", "y"))
    src, dst = _adjacency_lists(parts["graph"], obj["graph"], name)
    graph = obj["graph"]
    n = int(max(allx.shape[0], test_index.max() + 1, max(graph, default=-1) + 1, dst.max() + 1 if dst.size else 0))
    for part, arr, rows in (("tx", tx, len(test_index)), ("ty", ty, len(test_index)), ("ally", ally, allx.shape[0])):
        if arr.shape[0] != rows:
            raise DatasetError(
                f"{name}: {parts[part]} has {arr.shape[0]} rows, expected {rows}; "
                "the ind.* files do not belong together, re-copy them"
            )

    if tx.shape[1] != allx.shape[1]:
        raise DatasetError(f"{name}: {parts['tx']} has {tx.shape[1]} feature columns, {parts['allx']} "
                           f"{allx.shape[1]}; the ind.* files do not belong together, re-copy them")
    # Vertex v's feature row is row row_of[v] of [allx; tx; one empty row]: allx's rows
    # first, then row i of tx for vertex test.index[i] (it overrides), none for the rest.
    stacked = sp.vstack([allx, tx, sp.csr_matrix((1, allx.shape[1]), dtype=np.float32)], format="csr")
    row_of = np.full(n, stacked.shape[0] - 1, dtype=np.int64)
    row_of[: allx.shape[0]] = np.arange(allx.shape[0])
    row_of[test_index] = allx.shape[0] + np.arange(len(test_index))
    rows = stacked[row_of]
    x = feature_layout(csr_matrix(rows.indptr, rows.indices, rows.data, rows.shape, f"{name} features"))
    y = np.full(n, -1, dtype=np.int64)
    y[: len(ally)] = _onehot_to_label(ally)
    y[test_index] = _onehot_to_label(ty)
    num_train = len(y_train)

    indptr, indices, values, counts = undirected_csr(src, dst, n)
    no_features = int(n - allx.shape[0] - len(np.unique(test_index)))
    return make_graph(
        name,
        indptr=indptr,
        indices=indices,
        values=values,
        x=x,
        y=torch.from_numpy(y),
        train_idx=torch.arange(num_train),
        val_idx=torch.arange(num_train, num_train + 500),
        test_idx=torch.from_numpy(np.sort(test_index)),
        num_classes=int(ally.shape[1]),
        name=name,
        meta={
            "source": str(files[0].parent),
            "split": "planetoid (20 per class / 500 / 1000)",
            "padded_vertices": no_features,
            **counts,
        },
    )
